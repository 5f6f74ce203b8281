-- Merged lessons: every lesson with more than one version, and its chain (why each version exists, a merge's
-- similarity, the run and step that wrote it, its uses and lift), oldest version first.
SELECT h.experience_id, h.version, h.reason, round(CAST(h.similarity AS numeric), 3) AS similarity, h.run_id,
       h.step, h.is_current, h.active, h.uses, round(CAST(h.lift AS numeric), 3) AS lift,
       left(h.summary, 60) AS summary
FROM lesson_history h
WHERE h.experience_id IN (SELECT experience_id FROM experience_versions GROUP BY experience_id HAVING count(*) > 1)
ORDER BY h.experience_id, h.version
LIMIT 200;
