-- Lessons that hurt: versions with at least their pool's min_uses uses of known outcome (helped + hurt + even, what
-- eviction by lowest_utility waits for) whose lift (credited gain per graded attempt over the zero-shot baseline,
-- lesson_usefulness) is negative, worst first; still-active lessons are the ones to retire (lanpo pool retire).
SELECT h.experience_id, h.version, h.version_id, h.pool, h.active, h.is_current, h.uses, h.helped, h.hurt, h.even,
       h.unknown, round(CAST(h.lift AS numeric), 3) AS lift, left(h.summary, 60) AS summary
FROM lesson_history h
JOIN pools pl ON pl.id = h.pool_id
WHERE h.uses - h.unknown >= pl.min_uses AND h.lift < 0
ORDER BY h.lift, h.uses DESC, h.version_id
LIMIT 50;
