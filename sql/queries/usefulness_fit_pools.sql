-- Every pool whose lessons have a lesson_usefulness row (usefulness.refit: what a migration that changes the fit
-- runs), in id order.
SELECT DISTINCT e.pool_id
FROM lesson_usefulness lu
JOIN experience_versions v ON v.id = lu.version_id
JOIN experiences e ON e.id = v.experience_id
ORDER BY e.pool_id
