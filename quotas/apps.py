from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chorus.api.views import register_tenant_admission
        from quotas.admission import tenant_request_admit

        register_tenant_admission(tenant_request_admit)
