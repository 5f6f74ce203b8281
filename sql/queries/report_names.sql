-- Every experiment and run a report can be made of, newest first (for a hint when a name matches nothing).
SELECT kind, name
FROM (
    SELECT 'experiment' AS kind, e.name, e.started_at FROM experiments AS e
    UNION ALL
    SELECT 'run' AS kind, r.name, r.started_at FROM runs AS r
) AS named
ORDER BY started_at DESC, name
