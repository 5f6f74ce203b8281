-- Experiences that enter history without ever joining the active pool (add_evicted: e.g. MEL's rejected lessons):
-- marked evicted now, by :evicted_by.
UPDATE experiences SET evicted_at = now(), evicted_by = :evicted_by WHERE id = ANY(CAST(:ids AS bigint[]))
