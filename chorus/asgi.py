import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
django_application = get_asgi_application()

from chorus.body_limit import BodyLimitMiddleware  # noqa: E402  (needs settings loaded)

application = BodyLimitMiddleware(django_application)
