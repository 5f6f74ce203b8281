-- Upsert one metric value of (run, step).
INSERT INTO run_metrics (run_id, step, name, value) VALUES (:run_id, :step, :name, :value)
ON CONFLICT (run_id, step, name) DO UPDATE SET value = EXCLUDED.value
