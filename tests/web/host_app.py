"""A host application with its own routes, login (Flask-Login) and layout, embedding think-jobs
under /ops/agents: its login decides who may read (any user) and who may change (operators)."""

from __future__ import annotations

from pathlib import Path

from flask import Flask, Request, redirect, request
from flask.typing import ResponseReturnValue
from flask_login import LoginManager, UserMixin, current_user, login_user

from think_jobs import ThinkJobs
from web import ThinkJobsFlask

PREFIX = "/ops/agents"
ROLES = {"alice": "operator", "bob": "viewer"}
JOBS: ThinkJobs | None = None  # for THINK_JOBS_APP=tests.web.host_app:JOBS


class User(UserMixin):  # type: ignore[misc]  # flask_login is untyped
    def __init__(self, name: str) -> None:
        self.id = name
        self.role = ROLES[name]


def can_access(request: Request, scope: str) -> bool:
    """The host's rule: every user may look; only operators may change anything."""
    if not current_user.is_authenticated:
        return False
    return scope == "read" or current_user.role == "operator"


def create_host_app(jobs: ThinkJobs, **config: object) -> Flask:
    app = Flask(__name__, template_folder=str(Path(__file__).parent / "host_templates"))
    app.config.update(SECRET_KEY="host-secret-key", TESTING=True, **config)
    logins = LoginManager(app)
    logins.user_loader(lambda name: User(name) if name in ROLES else None)

    @app.get("/")
    def home() -> str:
        return "host home"

    @app.post("/login")
    def login() -> ResponseReturnValue:
        login_user(User(request.form["user"]))
        return redirect(request.args.get("next") or "/")

    ThinkJobsFlask(app, jobs=jobs, url_prefix=PREFIX, authorize=can_access, login_url="/login")
    return app
