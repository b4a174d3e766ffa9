"""The light worker kind: one queue only (`light`, or `webhooks` on workers of its
own), no engine, and what is routed there."""

from __future__ import annotations

from django.conf import settings

from chorus.celery import app
from synthesis.worker import is_light_worker, light_worker_argv, worker_argv


def test_a_worker_without_synthesis_queues_is_light() -> None:
    assert is_light_worker(["light"])
    assert not is_light_worker(list(settings.SYNTH_QUEUES))
    assert not is_light_worker(["synth.high", "light"])  # a GPU worker stays one
    assert not is_light_worker([])


def test_the_light_worker_takes_only_the_light_queue_on_threads() -> None:
    argv = light_worker_argv(hostname="light1@%h")
    assert argv[argv.index("-Q") + 1] == settings.LIGHT_QUEUE == "light"
    assert argv[argv.index("--pool") + 1] == "threads"
    assert argv[argv.index("--concurrency") + 1] == str(settings.LIGHT_WORKER_CONCURRENCY)
    assert argv[-2:] == ["--hostname", "light1@%h"]
    assert "light" not in worker_argv()[worker_argv().index("-Q") + 1]


def test_the_webhook_worker_takes_only_the_webhooks_queue_on_threads_of_its_own() -> None:
    argv = light_worker_argv(queue=settings.WEBHOOK_QUEUE, hostname="webhooks1@%h")
    assert argv[argv.index("-Q") + 1] == settings.WEBHOOK_QUEUE == "webhooks"
    assert argv[argv.index("--pool") + 1] == "threads"
    assert argv[argv.index("--concurrency") + 1] == str(settings.WEBHOOK_WORKER_CONCURRENCY)
    assert is_light_worker([settings.WEBHOOK_QUEUE])
    # The light worker does not take deliveries: a stalled receiver never holds
    # a thread that splits, joins or archives.
    light = light_worker_argv()
    assert settings.WEBHOOK_QUEUE not in light[light.index("-Q") + 1].split(",")


def test_webhook_deliveries_have_a_queue_of_their_own_and_archives_stay_light() -> None:
    import batches.tasks  # noqa: F401  (registers the tasks)
    import webhooks.tasks  # noqa: F401

    route = app.amqp.router.route({}, "webhooks.deliver")
    assert route["queue"].name == "webhooks"
    route = app.amqp.router.route({}, "batches.build_archive")
    assert route["queue"].name == "light"
    route = app.amqp.router.route({}, "synthesis.synthesize_job")
    assert route["queue"].name == "synth.normal"
