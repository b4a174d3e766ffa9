from django.apps import AppConfig


class SynthesisConfig(AppConfig):
    name = "synthesis"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import synthesis.tasks  # noqa: F401  (registers the publishers: `synthesis.publishers`)
