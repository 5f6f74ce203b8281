-- Use diagnostics per run, step and mode (lanpo.diagnostics; docs/concepts.md, "Use diagnostics"): one row per
-- `use/<diagnostic>/<mode>` metric of run_metrics: the diagnostic's mean over the step's rollouts of that mode.
-- diagnostic: sections | echo | answer_only | answer_copied; mode: intra | inter | retrieval | self_correct, and
-- zero_shot for answer_only (the reference without a context).
CREATE OR REPLACE VIEW use_diagnostics AS
SELECT m.run_id, r.name AS run_name, m.step,
       split_part(m.name, '/', 3) AS mode,
       split_part(m.name, '/', 2) AS diagnostic,
       m.value
FROM run_metrics m
JOIN runs r ON r.id = m.run_id
WHERE m.name LIKE 'use/%/%';
