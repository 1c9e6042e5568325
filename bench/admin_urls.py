"""The benchmark's URLs: the admin alone (``python -m bench.admin``)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
