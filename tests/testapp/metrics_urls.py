"""The URLconf of tests/test_metrics.py: the metrics view as docs/metrics.md routes it."""

from django.urls import path

from soniq_django.metrics import metrics_view

urlpatterns = [path("metrics", metrics_view)]
