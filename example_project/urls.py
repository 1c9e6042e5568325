from django.contrib import admin
from django.urls import path

from example_project.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.place_order, name="place-order"),
    path("orders/async/", views.place_order_async, name="place-order-async"),
    path("jobs/<uuid:job_id>/", views.job_status, name="job-status"),
]
