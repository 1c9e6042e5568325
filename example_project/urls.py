from django.contrib import admin
from django.urls import path

from example_project.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.place_order, name="place-order"),
]
