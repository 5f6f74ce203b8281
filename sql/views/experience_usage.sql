-- Per experience version: how often it was injected into a prompt, the mean reward of the attempts that used
-- it, and next to it the mean zero-shot reward of the same problems (each use weighted once: the mean over
-- uses of that problem's mean zero-shot reward). lift = mean over uses of (reward - zero-shot mean of the
-- problem), over the uses whose problem has zero-shot attempts. Versions never used appear with 0 uses.
CREATE OR REPLACE VIEW experience_usage AS
WITH zero_shot AS (
    SELECT problem_id, avg(reward) AS reward
    FROM attempts
    WHERE mode = 'zero_shot' AND reward IS NOT NULL
    GROUP BY problem_id
),
uses AS (
    SELECT ac.experience_version_id AS version_id, a.id AS attempt_id, a.problem_id, a.reward,
           zs.reward AS zero_shot_reward
    FROM attempt_contexts ac
    JOIN attempts a ON a.id = ac.attempt_id
    LEFT JOIN zero_shot zs ON zs.problem_id = a.problem_id
    WHERE ac.experience_version_id IS NOT NULL
)
SELECT v.id AS version_id, v.experience_id, v.version, e.problem_id AS source_problem_id,
       e.evicted_at IS NULL AS active,
       count(u.attempt_id) AS times_injected,
       count(DISTINCT u.problem_id) AS problems,
       avg(u.reward) AS mean_reward_with,
       avg(u.zero_shot_reward) AS zero_shot_mean_reward,
       avg(u.reward - u.zero_shot_reward) AS lift
FROM experience_versions v
JOIN experiences e ON e.id = v.experience_id
LEFT JOIN uses u ON u.version_id = v.id
GROUP BY v.id, v.experience_id, v.version, e.problem_id, e.evicted_at;
