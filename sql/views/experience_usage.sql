-- Per experience version: how often it was injected into a prompt, the mean reward of the attempts that used
-- it, and next to it the mean zero-shot reward of the same problems (each use weighted once: the mean over
-- uses of that problem's mean zero-shot reward). lift = mean over uses of (reward - zero-shot mean of the
-- problem), over the uses whose problem has zero-shot attempts. Versions never used appear with 0 uses.
CREATE OR REPLACE VIEW experience_usage AS
WITH zero_shot AS (
    SELECT g.problem_id, avg(a.reward) AS reward
    FROM attempts a
    JOIN rollout_groups g ON g.id = a.group_id
    WHERE g.mode = 'zero_shot' AND a.reward IS NOT NULL
    GROUP BY g.problem_id
),
uses AS (
    SELECT gc.experience_version_id AS version_id, a.id AS attempt_id, g.problem_id, a.reward,
           zs.reward AS zero_shot_reward
    FROM group_contexts gc
    JOIN rollout_groups g ON g.id = gc.group_id
    JOIN attempts a ON a.group_id = g.id
    LEFT JOIN zero_shot zs ON zs.problem_id = g.problem_id
    WHERE gc.experience_version_id IS NOT NULL
)
SELECT v.id AS version_id, v.experience_id, v.version, e.pool_id, e.problem_id AS source_problem_id,
       e.evicted_at IS NULL AS active,
       count(u.attempt_id) AS times_injected,
       count(DISTINCT u.problem_id) AS problems,
       avg(u.reward) AS mean_reward_with,
       avg(u.zero_shot_reward) AS zero_shot_mean_reward,
       avg(u.reward - u.zero_shot_reward) AS lift
FROM experience_versions v
JOIN experiences e ON e.id = v.experience_id
LEFT JOIN uses u ON u.version_id = v.id
GROUP BY v.id, v.experience_id, v.version, e.pool_id, e.problem_id, e.evicted_at;
