"""The append-only, hash-chained audit trail of every credit and scheduling decision."""

from django.db import models


class AuditEvent(models.Model):
    """One decision or change, written in the same transaction as the change it describes."""

    class ActorType(models.TextChoices):
        USER = "user"
        API_KEY = "api_key"
        SYSTEM = "system"
        SCHEDULER = "scheduler"
        AGENT = "agent"

    created_at = models.DateTimeField(db_index=True)  # database clock
    org_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=64, blank=True, default="")
    action = models.CharField(max_length=64, db_index=True)  # e.g. "ledger.hold", "sched.place"
    subject_type = models.CharField(max_length=64)
    subject_id = models.CharField(max_length=64)
    amount = models.BigIntegerField(null=True, blank=True)  # micro-credits, when money moved
    reason_code = models.CharField(max_length=64, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    request_id = models.CharField(max_length=64, blank=True, default="")
    # Hash chain: each event commits to its predecessor in the same chain.
    chain = models.CharField(max_length=64, default="global")
    seq = models.BigIntegerField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # How `hash` was computed (audit/chain.py): 1 = Python canonical JSON (`event_digest`),
    # 2 = PostgreSQL's jsonb text (`event_digest_v2`, written by the ledger's SQL functions).
    hash_format = models.PositiveSmallIntegerField(default=1, db_default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="audit_chain_seq_unique"),
        ]
        indexes = [models.Index(fields=["subject_type", "subject_id"], name="audit_subject_idx")]

    def __str__(self) -> str:
        return f"{self.action} {self.subject_type}:{self.subject_id}"


class AuditChainHead(models.Model):
    """The last (seq, hash) of a chain; locked to append, so the chain has no forks."""

    chain = models.CharField(max_length=64, primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.chain}@{self.seq}"
