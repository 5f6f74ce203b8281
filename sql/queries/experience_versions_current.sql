-- The latest version of each given experience.
SELECT DISTINCT ON (experience_id)
       id, experience_id, version, summary, author, policy_version_id, prompt_version, created_at
FROM experience_versions
WHERE experience_id = ANY(CAST(:experience_ids AS bigint[]))
ORDER BY experience_id, version DESC
