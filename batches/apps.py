from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "batches"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from batches import receivers, tasks  # noqa: F401  (connects them; registers publishers)
        from batches.cancelling import CLAIM_GUARD_SQL
        from synthesis.job_rows import claim_guard_register

        # No item of a cancelled batch starts (`batches.cancelling`).
        claim_guard_register(CLAIM_GUARD_SQL)
