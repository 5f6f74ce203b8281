-- Create an experiment unless one of that name exists (the caller reads it back and compares its config).
INSERT INTO experiments (name, config) VALUES (:name, CAST(:config AS jsonb)) ON CONFLICT (name) DO NOTHING
