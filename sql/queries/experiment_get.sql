-- One experiment by name.
SELECT id, name, config, status FROM experiments WHERE name = :name
