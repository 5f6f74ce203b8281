-- A lesson_usefulness row for every version a context ever held (usefulness.rebuild; a row that exists stays).
INSERT INTO lesson_usefulness (version_id)
SELECT DISTINCT experience_version_id FROM group_contexts WHERE experience_version_id IS NOT NULL
ON CONFLICT (version_id) DO NOTHING
