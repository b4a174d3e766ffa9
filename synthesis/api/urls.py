from django.urls import path

from synthesis.api import downloads, openai, playground, provenance, realtime, views

urlpatterns = [
    path("voices", views.VoiceListCreateView.as_view(), name="voice-list"),
    path("voices/<uuid:voice_id>", views.VoiceDetailView.as_view(), name="voice-detail"),
    path("speech", views.SpeechListCreateView.as_view(), name="speech-list"),
    path("speech/<uuid:job_id>", views.SpeechDetailView.as_view(), name="speech-detail"),
    path("speech/<uuid:job_id>/cancel", views.SpeechCancelView.as_view(), name="speech-cancel"),
    path("playground/", playground.PlaygroundView.as_view(), name="realtime-playground"),
    path("realtime/tokens", realtime.RealtimeTokenView.as_view(), name="realtime-tokens"),
    path("audio/speech", openai.audio_speech_view(), name="openai-audio-speech"),
    path(
        "provenance/verify",
        provenance.ProvenanceVerifyView.as_view(),
        name="provenance-verify",
    ),
    path(
        "files/<str:bucket>/<path:key>", downloads.FileDownloadView.as_view(), name="file-download"
    ),
]
