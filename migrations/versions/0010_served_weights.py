"""policy_versions.served_sha256: the weights a rollout engine served for a policy version, when not its own

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

Every attempt records the hash of the weights that served it (`attempts.served_adapter_sha256`), and a policy
version records the hash of its own weights (`adapter_sha256`: a LoRA adapter's, or all the weights' under full
fine-tuning). The two are equal, except when the engine serves a LoRA policy merged into a copy of the base
weights (`rollout.vllm.lora_sync = "merged"`): then the engine's hash is that of the merged weights, and this
column ties it to the adapter's version, so that

    attempts.served_adapter_sha256 = coalesce(policy_versions.served_sha256, policy_versions.adapter_sha256)

holds for every attempt of a version. NULL: the engine served the version's own weights. Nullable, no default:
adding it rewrites no row.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("policy_versions", sa.Column("served_sha256", sa.Text(), nullable=True))
    op.create_check_constraint(
        op.f("ck_policy_versions_served_sha256_hex"),
        "policy_versions",
        "served_sha256 IS NULL OR served_sha256 ~ '^[0-9a-f]{64}$'",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_policy_versions_served_sha256_hex"), "policy_versions")
    op.drop_column("policy_versions", "served_sha256")
