-- Dataset names in the store.
SELECT DISTINCT dataset FROM problems ORDER BY dataset
