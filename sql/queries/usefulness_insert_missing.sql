-- A zero lesson_usefulness row for each given version that exists and has none yet, in version order (so two
-- refreshers that insert the same rows wait on each other in one order); what exists already is left alone.
INSERT INTO lesson_usefulness (version_id)
SELECT v.id FROM experience_versions v WHERE v.id = ANY(CAST(:version_ids AS bigint[])) ORDER BY v.id
ON CONFLICT (version_id) DO NOTHING
