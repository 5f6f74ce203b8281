-- The runs and experiments whose name is one of :names (a name may be both: the caller says it is ambiguous).
SELECT 'run' AS kind, r.id, r.name
FROM runs AS r
WHERE r.name = ANY(CAST(:names AS text[]))
UNION ALL
SELECT 'experiment' AS kind, e.id, e.name
FROM experiments AS e
WHERE e.name = ANY(CAST(:names AS text[]))
ORDER BY kind, name
