-- Whether (run, step) has a metric whose name starts with :prefix.
SELECT EXISTS (
    SELECT 1 FROM run_metrics WHERE run_id = :run_id AND step = :step AND starts_with(name, :prefix)
)
