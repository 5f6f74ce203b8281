-- Append a version (max + 1) to an experience, with why (:reason, :similarity for a merge) and whence its text came
-- (source attempt, reward, run and step); call it holding experience_lock.
INSERT INTO experience_versions (experience_id, version, summary, embedding, author, policy_version_id, prompt_version,
                                 reason, similarity, source_attempt_id, reward, run_id, step)
SELECT :experience_id, coalesce(max(version), 0) + 1, :summary, CAST(:embedding AS vector), :author,
       :policy_version_id, :prompt_version, :reason, :similarity, :source_attempt_id, :reward, :run_id, :step
FROM experience_versions
WHERE experience_id = :experience_id
RETURNING id
