-- Fig. 2c's random arm (feedback.inter.draw = "random", the paper's "reuse correct trajectories discovered during
-- training as in-context demonstrations for other problems ... by random sampling"): per problem, :k of run :run_id's
-- CORRECT attempts (groups of the ordinary training modes :modes only: never val, MEL's replays, replayed or leaked
-- groups) of OTHER problems, drawn uniformly without replacement. No relevance, no ranking: every candidate keys
-- lanpo_draw_key(seed, ordinal, problem, 0) = -ln(u), u from sha256('<ordinal>/<problem id>/<seed>'), and the
-- :k smallest keys win, so every k-subset of the candidates is equally likely (uniform over attempts: a problem
-- with more correct attempts is drawn more often). The ordinal is the attempt's place among the run's correct
-- attempts (oldest 1), not its id, so runs whose histories match draw alike whatever else the store holds. Costs
-- one key per (problem asked, correct attempt of the run).
-- Returns one row per draw: problem, attempt id, the attempt's problem, draw position (0-based), its response.
WITH req AS (
    SELECT DISTINCT unnest(CAST(:problem_ids AS bigint[])) AS problem_id
),
candidates AS (
    SELECT a.id AS candidate_id, g.problem_id AS source_problem_id, row_number() OVER (ORDER BY a.id) AS ordinal
    FROM rollout_groups g
    JOIN attempts a ON a.group_id = g.id
    WHERE g.run_id = :run_id AND a.correct AND g.mode = ANY(CAST(:modes AS text[]))
),
keyed AS (
    SELECT req.problem_id, c.candidate_id, c.source_problem_id,
           lanpo_draw_key(CAST(:seed AS bigint), c.ordinal, req.problem_id, 0) AS key
    FROM req
    JOIN candidates c ON c.source_problem_id <> req.problem_id
),
drawn AS (
    SELECT problem_id, candidate_id, source_problem_id,
           row_number() OVER (PARTITION BY problem_id ORDER BY key, candidate_id) - 1 AS position
    FROM keyed
)
SELECT d.problem_id, d.candidate_id, d.source_problem_id, d.position, a.response AS text
FROM drawn d
JOIN attempts a ON a.id = d.candidate_id
WHERE d.position < :k
ORDER BY d.problem_id, d.position
