-- Append a version (max + 1) to an experience; call it holding experience_lock.
INSERT INTO experience_versions (experience_id, version, summary, embedding, author, policy_version_id, prompt_version)
SELECT :experience_id, coalesce(max(version), 0) + 1, :summary, CAST(:embedding AS vector), :author,
       :policy_version_id, :prompt_version
FROM experience_versions
WHERE experience_id = :experience_id
RETURNING id
