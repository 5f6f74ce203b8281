-- Every version of one experience, oldest first.
SELECT id, experience_id, version, summary, author, policy_version_id, prompt_version, created_at
FROM experience_versions
WHERE experience_id = :experience_id
ORDER BY version
