-- The value of each lesson version in :version_ids for value-aware retrieval (retrieval.rank = value):
-- lanpo_lesson_value (migrations 0020, 0025), the upper confidence bound on its lift under a N(mean, :prior_sd^2)
-- prior, from its lesson_usefulness row's net_credit and net_credit_var (migration 0024: its pool's uses with the
-- lessons drawn beside it integrated out; none yet: untried, mean + z * prior_sd). The mean is 0, or with
-- :prior = 'pool' its pool's graded lessons' mean lift (lanpo_pool_prior_mean, once a pool).
WITH v AS (
    SELECT v.id, e.pool_id
    FROM unnest(CAST(:version_ids AS bigint[])) AS ids(id)
    JOIN experience_versions v ON v.id = ids.id
    JOIN experiences e ON e.id = v.experience_id
),
prior AS (
    SELECT p.pool_id, CASE WHEN :prior = 'pool' THEN lanpo_pool_prior_mean(p.pool_id, :prior_sd) ELSE 0 END AS mean
    FROM (SELECT DISTINCT pool_id FROM v) p
)
SELECT v.id AS version_id,
       lanpo_lesson_value(u.graded, u.net_credit, u.net_credit_var, :prior_sd, :z, prior.mean) AS value
FROM v
JOIN prior ON prior.pool_id = v.pool_id
LEFT JOIN lesson_usefulness u ON u.version_id = v.id
