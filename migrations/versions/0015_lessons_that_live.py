"""lessons that live: merge and utility settings, versions' provenance, retirement notes, usefulness, views

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05

- `pools`: `min_uses` (lowest_utility acts on a lesson only after this many uses with a known outcome), the merge
  settings `merge_threshold` (NULL: never merge) and `merge_keeps`, and `max_policy_age` (NULL: lessons never
  expire); `eviction` may now read `lowest_utility`. Existing pools keep their behaviour: no merge, no expiry.
- `experience_versions`: `reason` (new | rewrite | merge:newer | merge:higher_reward), `similarity` (a merge's
  cosine to the version it supersedes; set exactly on merges), and the provenance of each version's own text:
  `source_attempt_id`, `reward`, `run_id`, `step`. Version 1 of every existing lesson takes its experience's
  provenance, later versions read `rewrite`. The immutability trigger now covers the new columns too.
- `experiences.evicted_note`: a person's reason for a retirement (`lanpo pool retire`, `evicted_by =
  'manual:retired'`).
- `lesson_uses`: per use (a lesson version in a rollout group's context), its outcome against the zero-shot
  baseline (helped 1, hurt -1, even 0, unknown NULL), graded attempts and credited gain, precomputed; deleted with
  its group or version.
- `lesson_usefulness`: per lesson version, its uses by outcome (helped, hurt, even, unknown), its graded attempts
  and credited gain: the sum of its `lesson_uses` rows (`lanpo.db.repo.usefulness` keeps both current; filled here
  from the history by the writers' statements, `sql/queries/usefulness_uses_recompute.sql` for every use and
  `sql/queries/usefulness_recompute.sql` for every version a context ever held). The serving role may insert and
  update both: `POST /v1/feedback` changes a use's outcome.
- Views (definitions also in sql/views/): `lesson_history`, one row per lesson version with its reason, provenance,
  the lesson's state and the version's usefulness; `pool_churn`, per pool, run and step the lessons added, merged,
  evicted, expired and retired by hand.

Downgrade drops the views, the tables and the columns, and evicts nothing back: lessons retired by use or expiry
stay retired.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

OLD_EVICTION = ("oldest", "lowest_reward", "lowest_relevance")
EVICTION = (*OLD_EVICTION, "lowest_utility")
MERGE_KEEPS = ("newer", "higher_reward")
VERSION_REASONS = ("new", "rewrite", "merge:newer", "merge:higher_reward")

IMMUTABLE = """
CREATE OR REPLACE FUNCTION lanpo_experience_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.experience_id, NEW.version, NEW.summary, NEW.author, NEW.policy_version_id, NEW.prompt_version,
        NEW.created_at{new}) IS DISTINCT FROM (OLD.experience_id, OLD.version, OLD.summary, OLD.author,
        OLD.policy_version_id, OLD.prompt_version, OLD.created_at{old})
       OR (OLD.embedding IS NOT NULL AND NEW.embedding IS DISTINCT FROM OLD.embedding) THEN
        RAISE EXCEPTION 'experience_versions are immutable (id %): append a new version instead', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
"""
# the provenance columns may still be emptied by their foreign keys' ON DELETE SET NULL (a deleted attempt or run)
NEW_IMMUTABLE = ", NEW.reason, NEW.similarity, NEW.reward, NEW.step"
OLD_IMMUTABLE = ", OLD.reason, OLD.similarity, OLD.reward, OLD.step"

# the serving role, when 0014 (or an administrator since) created it
SERVE_ROLE = (
    "SELECT s.role_name FROM lanpo_private.serve_login s JOIN pg_catalog.pg_roles r ON r.rolname = s.role_name"
)

# the views of a lesson's life; the same definitions are in sql/views/ (tests/db/test_views.py proves it). The
# reader role reads them through 0004's default privileges.
LESSON_HISTORY = """
CREATE OR REPLACE VIEW lesson_history AS
SELECT e.id AS experience_id, e.pool_id, pl.name AS pool, e.problem_id AS source_problem_id, e.kind,
       v.id AS version_id, v.version, v.reason, v.similarity, v.summary, v.author, v.policy_version_id,
       pv.step AS policy_step, v.run_id, v.step, v.source_attempt_id, v.reward, v.created_at,
       v.version = max(v.version) OVER (PARTITION BY v.experience_id) AS is_current,
       e.evicted_at IS NULL AS active, e.evicted_by, e.evicted_at, e.evicted_run_id, e.evicted_step, e.evicted_note,
       coalesce(u.uses, 0) AS uses, coalesce(u.helped, 0) AS helped, coalesce(u.hurt, 0) AS hurt,
       coalesce(u.even, 0) AS even, coalesce(u.unknown, 0) AS unknown, coalesce(u.graded, 0) AS graded,
       coalesce(u.credit, 0) AS credit, u.credit / CAST(nullif(u.graded, 0) AS double precision) AS lift
FROM experiences e
JOIN pools pl ON pl.id = e.pool_id
JOIN experience_versions v ON v.experience_id = e.id
LEFT JOIN policy_versions pv ON pv.id = v.policy_version_id
LEFT JOIN lesson_usefulness u ON u.version_id = v.id;
"""

POOL_CHURN = """
CREATE OR REPLACE VIEW pool_churn AS
WITH events AS (
    SELECT e.pool_id, e.run_id, e.step, 'added' AS event, CAST(NULL AS text) AS evicted_by,
           CAST(count(*) AS integer) AS n
    FROM experiences e
    GROUP BY e.pool_id, e.run_id, e.step
    UNION ALL
    SELECT e.pool_id, v.run_id, v.step, 'merged', NULL, CAST(count(*) AS integer)
    FROM experience_versions v
    JOIN experiences e ON e.id = v.experience_id
    WHERE v.reason LIKE 'merge:%'
    GROUP BY e.pool_id, v.run_id, v.step
    UNION ALL
    SELECT e.pool_id, e.evicted_run_id, e.evicted_step, 'left', e.evicted_by, CAST(count(*) AS integer)
    FROM experiences e
    WHERE e.evicted_at IS NOT NULL
    GROUP BY e.pool_id, e.evicted_run_id, e.evicted_step, e.evicted_by
)
SELECT ev.pool_id, pl.name AS pool, ev.run_id, ev.step,
       coalesce(sum(ev.n) FILTER (WHERE ev.event = 'added'), 0) AS added,
       coalesce(sum(ev.n) FILTER (WHERE ev.event = 'merged'), 0) AS merged,
       coalesce(sum(ev.n) FILTER (WHERE ev.event = 'left'), 0) AS left_pool,
       coalesce(sum(ev.n) FILTER (WHERE ev.event = 'left' AND ev.evicted_by NOT LIKE 'expired:%'
                                  AND ev.evicted_by NOT LIKE 'manual:%'), 0) AS evicted,
       coalesce(sum(ev.n) FILTER (WHERE ev.evicted_by LIKE 'expired:%'), 0) AS expired,
       coalesce(sum(ev.n) FILTER (WHERE ev.evicted_by LIKE 'manual:%'), 0) AS retired,
       coalesce(jsonb_object_agg(ev.evicted_by, ev.n) FILTER (WHERE ev.event = 'left'), '{}') AS evicted_by
FROM events ev
JOIN pools pl ON pl.id = ev.pool_id
GROUP BY ev.pool_id, pl.name, ev.run_id, ev.step;
"""

VIEWS = {"lesson_history": LESSON_HISTORY, "pool_churn": POOL_CHURN}


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _eviction(policies: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_pools_eviction_valid"), "pools", type_="check")
    op.create_check_constraint(op.f("ck_pools_eviction_valid"), "pools", _in("eviction", policies))


def _pools() -> None:
    op.add_column("pools", sa.Column("min_uses", sa.Integer(), server_default="4", nullable=False))
    op.add_column("pools", sa.Column("merge_threshold", sa.Double(), nullable=True))
    op.add_column("pools", sa.Column("merge_keeps", sa.Text(), server_default="newer", nullable=False))
    op.add_column("pools", sa.Column("max_policy_age", sa.Integer(), nullable=True))
    op.create_check_constraint(op.f("ck_pools_min_uses_positive"), "pools", "min_uses >= 1")
    op.create_check_constraint(
        op.f("ck_pools_merge_threshold_range"), "pools",
        "merge_threshold IS NULL OR (merge_threshold > 0 AND merge_threshold <= 1)",
    )  # fmt: skip
    op.create_check_constraint(op.f("ck_pools_merge_keeps_valid"), "pools", _in("merge_keeps", MERGE_KEEPS))
    op.create_check_constraint(
        op.f("ck_pools_max_policy_age_positive"), "pools", "max_policy_age IS NULL OR max_policy_age >= 1"
    )
    _eviction(EVICTION)


def _versions() -> None:
    op.add_column("experience_versions", sa.Column("reason", sa.Text(), server_default="new", nullable=False))
    for name, kind in (("similarity", sa.Double()), ("source_attempt_id", sa.BigInteger()), ("reward", sa.Double()),
                       ("run_id", sa.BigInteger()), ("step", sa.Integer())):  # fmt: skip
        op.add_column("experience_versions", sa.Column(name, kind, nullable=True))
    # the old trigger does not look at the new columns: fill them, then let it guard them
    op.execute(
        "UPDATE experience_versions v SET source_attempt_id = e.source_attempt_id, reward = e.reward, "
        "run_id = e.run_id, step = e.step FROM experiences e WHERE e.id = v.experience_id AND v.version = 1"
    )
    op.execute("UPDATE experience_versions SET reason = 'rewrite' WHERE version > 1")
    op.execute(IMMUTABLE.format(new=NEW_IMMUTABLE, old=OLD_IMMUTABLE))
    op.create_foreign_key(
        op.f("fk_experience_versions_source_attempt_id_attempts"), "experience_versions", "attempts",
        ["source_attempt_id"], ["id"], ondelete="SET NULL",
    )  # fmt: skip
    op.create_foreign_key(
        op.f("fk_experience_versions_run_id_runs"), "experience_versions", "runs", ["run_id"], ["id"],
        ondelete="SET NULL",
    )  # fmt: skip
    op.create_check_constraint(op.f("ck_experience_versions_reason_valid"), "experience_versions",
                               _in("reason", VERSION_REASONS))  # fmt: skip
    op.create_check_constraint(
        op.f("ck_experience_versions_reward_finite"), "experience_versions",
        "reward IS NULL OR reward NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)",
    )  # fmt: skip
    op.create_check_constraint(
        op.f("ck_experience_versions_merge_similarity"), "experience_versions",
        "(reason LIKE 'merge:%') = (similarity IS NOT NULL)",
    )  # fmt: skip
    op.create_index(
        "ix_experience_versions_run_step", "experience_versions", ["run_id", "step"],
        postgresql_where=sa.text("run_id IS NOT NULL"),
    )  # fmt: skip


def _usefulness() -> None:
    op.create_table(
        "lesson_usefulness",
        sa.Column("version_id", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.Integer(), server_default="0", nullable=False)
          for name in ("uses", "helped", "hurt", "even", "unknown", "graded")),
        sa.Column("credit", sa.Double(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("uses = helped + hurt + even + unknown", name=op.f("ck_lesson_usefulness_uses_add_up")),
        sa.CheckConstraint("least(uses, helped, hurt, even, unknown, graded) >= 0",
                           name=op.f("ck_lesson_usefulness_counts_nonnegative")),
        sa.CheckConstraint(
            "credit IS NULL OR credit NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)",
            name=op.f("ck_lesson_usefulness_credit_finite"),
        ),
        sa.ForeignKeyConstraint(["version_id"], ["experience_versions.id"],
                                name=op.f("fk_lesson_usefulness_version_id_experience_versions"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("version_id", name=op.f("pk_lesson_usefulness")),
    )  # fmt: skip
    op.create_table(
        "lesson_uses",
        sa.Column("version_id", sa.BigInteger(), nullable=False),
        sa.Column("group_id", sa.BigInteger(), nullable=False),
        sa.Column("m", sa.Integer(), server_default="1", nullable=False),
        sa.Column("outcome", sa.SmallInteger(), nullable=True),
        sa.Column("graded", sa.Integer(), server_default="0", nullable=False),
        sa.Column("credit", sa.Double(), server_default="0", nullable=False),
        sa.CheckConstraint("m >= 1", name=op.f("ck_lesson_uses_m_positive")),
        sa.CheckConstraint("outcome IS NULL OR outcome IN (-1, 0, 1)", name=op.f("ck_lesson_uses_outcome_valid")),
        sa.CheckConstraint("graded >= 0", name=op.f("ck_lesson_uses_graded_nonnegative")),
        sa.CheckConstraint(
            "credit IS NULL OR credit NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)",
            name=op.f("ck_lesson_uses_credit_finite"),
        ),
        sa.ForeignKeyConstraint(["version_id"], ["experience_versions.id"],
                                name=op.f("fk_lesson_uses_version_id_experience_versions"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["group_id"], ["rollout_groups.id"],
                                name=op.f("fk_lesson_uses_group_id_rollout_groups"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("version_id", "group_id", name=op.f("pk_lesson_uses")),
    )  # fmt: skip
    op.create_index("ix_lesson_uses_group_id", "lesson_uses", ["group_id"])  # a group's delete cascades by it
    bind = op.get_bind()
    role = bind.scalar(sa.text(SERVE_ROLE))
    if role:
        quoted = bind.dialect.identifier_preparer.quote(role)
        # UPDATE by column: a role that may UPDATE a whole table is refused (lanpo.db.serve_role.check_unprivileged)
        columns = "uses, helped, hurt, even, unknown, graded, credit, updated_at"
        op.execute(f"GRANT SELECT, INSERT, UPDATE ({columns}) ON lesson_usefulness TO {quoted}")
        op.execute(f"GRANT SELECT, INSERT, UPDATE (m, outcome, graded, credit) ON lesson_uses TO {quoted}")


def _views() -> None:
    for ddl in VIEWS.values():
        op.execute(ddl)


# The writers' statements at this revision (sql/queries/usefulness_uses_recompute.sql and usefulness_recompute.sql
# as they were), which fill the tables from the history.
USES_RECOMPUTE = """
WITH groups AS (
    SELECT g.id, g.run_id, g.step, g.problem_id, g.policy_version_id
    FROM unnest(CAST(:run_ids AS bigint[]), CAST(:steps AS integer[]), CAST(:problem_ids AS bigint[]))
         AS k(run_id, step, problem_id)
    JOIN rollout_groups g ON g.run_id = k.run_id AND g.step = k.step AND g.problem_id = k.problem_id
    UNION ALL
    SELECT g.id, g.run_id, g.step, g.problem_id, g.policy_version_id
    FROM rollout_groups g
    WHERE g.id = ANY(CAST(:loose_group_ids AS bigint[]))
),
items AS (
    SELECT gc.group_id, gc.experience_version_id AS version_id, count(*) AS m,
           sum(count(*)) OVER (PARTITION BY gc.group_id) AS k
    FROM groups g
    JOIN group_contexts gc ON gc.group_id = g.id
    WHERE gc.experience_version_id IS NOT NULL
    GROUP BY gc.group_id, gc.experience_version_id
),
uses AS (
    SELECT * FROM items WHERE version_id = ANY(CAST(:version_ids AS bigint[]))
),
scored AS (
    SELECT g.id AS group_id, own.n, own.hits, zs.n AS zn, zs.hits AS zhits
    FROM groups g
    CROSS JOIN LATERAL (
        SELECT count(x.correct) AS n, coalesce(sum(x.correct), 0) AS hits
        FROM attempts a
        CROSS JOIN LATERAL (
            SELECT CAST(coalesce(a.correct, (
                SELECT f.correct FROM answer_feedback f
                WHERE f.attempt_id = a.id AND f.correct IS NOT NULL
                ORDER BY f.created_at DESC, f.id DESC LIMIT 1)) AS integer) AS correct
        ) x
        WHERE a.group_id = g.id
    ) own
    CROSS JOIN LATERAL (
        SELECT count(x.correct) AS n, coalesce(sum(x.correct), 0) AS hits
        FROM rollout_groups z
        JOIN attempts a ON a.group_id = z.id
        CROSS JOIN LATERAL (
            SELECT CAST(coalesce(a.correct, (
                SELECT f.correct FROM answer_feedback f
                WHERE f.attempt_id = a.id AND f.correct IS NOT NULL
                ORDER BY f.created_at DESC, f.id DESC LIMIT 1)) AS integer) AS correct
        ) x
        WHERE z.mode = 'zero_shot' AND z.run_id = g.run_id AND z.step = g.step AND z.problem_id = g.problem_id
          AND z.policy_version_id IS NOT DISTINCT FROM g.policy_version_id
    ) zs
    WHERE g.id IN (SELECT group_id FROM uses)
)
INSERT INTO lesson_uses AS lu (version_id, group_id, m, outcome, graded, credit)
SELECT u.version_id, u.group_id, u.m,
       CASE WHEN s.zn = 0 OR s.n = 0 THEN NULL ELSE CAST(sign(s.hits * s.zn - s.zhits * s.n) AS smallint) END,
       CASE WHEN s.zn = 0 THEN 0 ELSE u.m * s.n END,
       CASE WHEN s.zn = 0 OR s.n = 0 THEN 0
            ELSE u.m * (s.hits - s.n * (CAST(s.zhits AS double precision) / s.zn)) / u.k END
FROM uses u
JOIN scored s ON s.group_id = u.group_id
ORDER BY u.version_id, u.group_id
ON CONFLICT (version_id, group_id) DO UPDATE
SET m = EXCLUDED.m, outcome = EXCLUDED.outcome, graded = EXCLUDED.graded, credit = EXCLUDED.credit
WHERE (lu.m, lu.outcome, lu.graded, lu.credit) IS DISTINCT FROM
      (EXCLUDED.m, EXCLUDED.outcome, EXCLUDED.graded, EXCLUDED.credit)
"""

USEFULNESS_RECOMPUTE = """
WITH targets AS (
    SELECT version_id FROM lesson_usefulness WHERE version_id = ANY(CAST(:version_ids AS bigint[]))
)
INSERT INTO lesson_usefulness AS lu (version_id, uses, helped, hurt, even, unknown, graded, credit, updated_at)
SELECT t.version_id,
       count(u.group_id),
       count(*) FILTER (WHERE u.outcome > 0),
       count(*) FILTER (WHERE u.outcome < 0),
       count(*) FILTER (WHERE u.outcome = 0),
       count(u.group_id) FILTER (WHERE u.outcome IS NULL),
       coalesce(sum(u.graded), 0),
       coalesce(sum(u.credit), 0),
       now()
FROM targets t
LEFT JOIN lesson_uses u ON u.version_id = t.version_id
GROUP BY t.version_id
ON CONFLICT (version_id) DO UPDATE
SET uses = EXCLUDED.uses, helped = EXCLUDED.helped, hurt = EXCLUDED.hurt, even = EXCLUDED.even,
    unknown = EXCLUDED.unknown, graded = EXCLUDED.graded, credit = EXCLUDED.credit, updated_at = EXCLUDED.updated_at
"""


def _fill_usefulness() -> None:
    """Every use in the history gets its lesson_uses row and every version a context ever held its lesson_usefulness
    row, computed by the statements the writers used at this revision (all keys at once), frozen here as
    USES_RECOMPUTE and USEFULNESS_RECOMPUTE: the files in sql/queries/ move on with the schema (0018 added columns)."""
    bind = op.get_bind()
    bind.execute(
        sa.text(
            "INSERT INTO lesson_usefulness (version_id) SELECT DISTINCT experience_version_id FROM group_contexts "
            "WHERE experience_version_id IS NOT NULL"
        )
    )
    used = list(bind.scalars(sa.text("SELECT version_id FROM lesson_usefulness ORDER BY version_id")))
    if not used:
        return
    keys = bind.execute(
        sa.text(
            "SELECT DISTINCT g.run_id, g.step, g.problem_id FROM rollout_groups g WHERE EXISTS (SELECT 1 FROM "
            "group_contexts c WHERE c.group_id = g.id AND c.experience_version_id IS NOT NULL)"
        )
    ).all()
    full = [k for k in keys if k.run_id is not None and k.step is not None]
    loose = bind.scalars(
        sa.text(
            "SELECT g.id FROM rollout_groups g WHERE (g.run_id IS NULL OR g.step IS NULL) AND EXISTS (SELECT 1 FROM "
            "group_contexts c WHERE c.group_id = g.id AND c.experience_version_id IS NOT NULL)"
        )
    )
    params = {
        "run_ids": [k.run_id for k in full],
        "steps": [k.step for k in full],
        "problem_ids": [k.problem_id for k in full],
        "loose_group_ids": sorted(loose),
        "version_ids": used,
    }
    bind.execute(sa.text(USES_RECOMPUTE), params)
    bind.execute(sa.text(USEFULNESS_RECOMPUTE), {"version_ids": used})


def upgrade() -> None:
    _pools()
    _versions()
    op.add_column("experiences", sa.Column("evicted_note", sa.Text(), nullable=True))
    _usefulness()
    _fill_usefulness()
    _views()


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_table("lesson_uses")
    op.drop_table("lesson_usefulness")
    op.drop_column("experiences", "evicted_note")
    op.drop_index("ix_experience_versions_run_step", table_name="experience_versions")
    op.execute(IMMUTABLE.format(new="", old=""))
    for name in ("reason", "similarity", "source_attempt_id", "reward", "run_id", "step"):
        op.drop_column("experience_versions", name)  # drops its constraints and foreign keys with it
    op.execute("UPDATE pools SET eviction = 'oldest' WHERE eviction = 'lowest_utility'")
    _eviction(OLD_EVICTION)
    for name in ("min_uses", "merge_threshold", "merge_keeps", "max_policy_age"):
        op.drop_column("pools", name)
