from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Hooked into the layers below, which do not import this app.
        import webhooks.tasks  # noqa: F401  (registers the publisher of deliveries)
        from synthesis.job_events import on_job_finished
        from synthesis.services.sweeper import sweep_register_step
        from webhooks.events import job_event_publish
        from webhooks.services.deliveries import deliveries_publish_due, events_forget

        on_job_finished(job_event_publish)
        sweep_register_step("webhooks_published", deliveries_publish_due)
        sweep_register_step("webhooks_forgotten", events_forget)
