"""``RunWithoutModels``: the migrations' ``RunPython``, without the historical models.

Django's ``RunPython`` hands its code the project's historical models
(``from_state.apps``), and to do so renders every model of every installed
app again before each such step. No code a soniq_django migration runs reads
them: each executes SQL through the schema editor (the released files of
``sql/``, the frozen helpers here). So rendering them is pure cost, and it
was most of a ``migrate``'s time: about 2 of its 2.8 seconds for our 34
migrations in a small project, more in a project with many models of its
own. This operation runs the same code with ``apps=None``; everything else
(reversibility, hints, the router, ``elidable``) is ``RunPython``'s.
"""

from typing import Any

from django.db import migrations, router


class RunWithoutModels(migrations.RunPython):
    """``RunPython`` for code that reads no historical models (it is given ``apps=None``)."""

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if router.allow_migrate(schema_editor.connection.alias, app_label, **self.hints):
            self.code(None, schema_editor)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        if self.reverse_code is None:
            raise NotImplementedError("You cannot reverse this operation")
        if router.allow_migrate(schema_editor.connection.alias, app_label, **self.hints):
            self.reverse_code(None, schema_editor)
