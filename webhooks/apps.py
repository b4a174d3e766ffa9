from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Hooked into the layers below through their signals (they import no app above them).
        import webhooks.receivers
        import webhooks.tasks  # noqa: F401  (registers the publisher of deliveries)
