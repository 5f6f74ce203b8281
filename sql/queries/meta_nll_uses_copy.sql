-- Bulk load of the lessons a step's NLL term trained on (psycopg cursor.copy, text rows).
COPY meta_nll_uses (experience_id, run_id, step, target, attempt_id, tokens) FROM STDIN
