-- The value of each lesson version in :version_ids for value-aware retrieval (retrieval.rank = value):
-- lanpo_lesson_value (migration 0020), the upper confidence bound on its lift under a N(0, :prior_sd^2) prior,
-- from its lesson_usefulness row's net_credit and net_credit_var (migration 0024: its pool's uses with the lessons
-- drawn beside it integrated out; none yet: untried, z * prior_sd).
SELECT v.id AS version_id, lanpo_lesson_value(u.graded, u.net_credit, u.net_credit_var, :prior_sd, :z) AS value
FROM unnest(CAST(:version_ids AS bigint[])) AS v(id)
LEFT JOIN lesson_usefulness u ON u.version_id = v.id
