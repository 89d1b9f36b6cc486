"""Admin pages (server-rendered, no build step): agents, the dashboard, submissions, a turn's
live detail, schedules. Every change is a POST form with a CSRF token; read-only sessions see
no buttons and get 403 if they post anyway. Pages work without JavaScript; only the live
stream uses it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.typing import ResponseReturnValue
from pydantic import Field
from werkzeug.routing import BuildError

from think_jobs import SubmissionStatus
from web import admin_data, auth, csrf, params, security
from web import dashboard as dashboard_page
from web.admin_auth import handle_error, login_target
from web.api_agents import agent_list
from web.api_streams import stored_status
from web.current import current_extension
from web.errors import ApiError
from web.schemas import Identifier, StrictModel

bp = Blueprint(
    "think_jobs_admin",
    __name__,
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)
security.protect(bp)
bp.register_error_handler(Exception, handle_error)
AGENT = "/agents/<agent_type>/<agent_name>"
FLASH = "think_jobs"


class PageQuery(StrictModel):
    status: list[SubmissionStatus] | None = None
    before: Identifier | None = None


class AgentsQuery(StrictModel):
    page: int = Field(1, ge=1, le=1_000_000)


@bp.context_processor
def page_helpers() -> dict[str, Any]:
    return {
        "csrf_token": csrf.generate,
        "can_write": auth.allowed(auth.WRITE),
        "builtin_login": current_extension().authorize is None,
        "statuses": list(SubmissionStatus),
        "duration": admin_data.duration,
    }


@bp.get("/login")
@auth.marked(auth.PUBLIC)
def login() -> ResponseReturnValue:
    if current_extension().authorize is not None:
        return redirect(login_target())
    return render_template(
        "think_jobs/login.html",
        next=_safe_next(request.args.get("next")),
        plain_http_hint=PLAIN_HTTP_HINT if _secure_cookie_over_http() else None,
    )


PLAIN_HTTP_HINT = (
    "This page came over plain HTTP, but the session cookie is HTTPS-only, so the browser "
    "does not send it back and logging in cannot work: serve the app over HTTPS, or set "
    "THINK_JOBS_SESSION_COOKIE_SECURE=false (plain-HTTP mode, trusted networks only)."
)


def _secure_cookie_over_http() -> bool:
    """HTTPS-only cookie, plain-HTTP request, and not a loopback host (browsers treat
    ``http://localhost`` and ``http://127.0.0.1`` as secure and keep the cookie there)."""
    loopback = urlsplit("//" + request.host).hostname in {"localhost", "127.0.0.1", "::1"}
    secure_only = bool(current_app.config.get("SESSION_COOKIE_SECURE"))
    return secure_only and not request.is_secure and not loopback


def _cookie_refused_over_http() -> bool:
    """A login form posted over plain HTTP without the session cookie it was served with."""
    cookie = current_app.config.get("SESSION_COOKIE_NAME", "session")
    return _secure_cookie_over_http() and cookie not in request.cookies


@bp.post("/login")
@auth.marked(auth.PUBLIC)
def login_submit() -> ResponseReturnValue:
    if _cookie_refused_over_http():
        raise ApiError(400, PLAIN_HTTP_HINT, type="session_cookie_not_sent")
    csrf.require_valid()
    target = _safe_next(request.form.get("next"))
    if not auth.log_in(request.form.get("token", "")):
        page = render_template("think_jobs/login.html", next=target, failed=True)
        return page, 401
    return redirect(target or url_for(".agents"))


@bp.post("/logout")
@auth.marked(auth.PUBLIC)
def logout() -> ResponseReturnValue:
    csrf.require_valid()
    auth.log_out()
    return redirect(url_for(".login"))


@bp.get("/")
@auth.requires(auth.READ)
def agents() -> str:
    """The agents, a page at a time (``THINK_JOBS_ADMIN_PAGE_SIZE`` rows), busiest first."""
    overview = agent_list()
    size = int(current_app.config["THINK_JOBS_ADMIN_PAGE_SIZE"])
    page = admin_data.agents_page(overview.agents, page=params.query(AgentsQuery).page, size=size)
    return render_template("think_jobs/agents.html", overview=overview, page=page)


@bp.get("/dashboard")
@auth.requires(auth.READ)
def dashboard() -> str:
    return dashboard_page.render()


@bp.get("/open")
@auth.requires(auth.READ)
def open_agent() -> ResponseReturnValue:
    """Target of the "open an agent" form (a GET form cannot fill in path parameters)."""
    agent = params.agent(request.args.get("agent_type", ""), request.args.get("agent_name", ""))
    return redirect(url_for(".submissions", agent_type=agent.agent_type, agent_name=agent.name))


@bp.get(AGENT + "/")
@auth.requires(auth.READ)
def submissions(agent_type: str, agent_name: str) -> str:
    agent = params.agent(agent_type, agent_name)
    query = params.query(PageQuery)
    size = int(current_app.config["THINK_JOBS_ADMIN_PAGE_SIZE"])
    page = agent.page_submissions(status=query.status, limit=size, before=query.before)
    return render_template(
        "think_jobs/submissions.html",
        agent=agent,
        page=page,
        before=query.before,
        selected=query.status or [],
    )


@bp.get(AGENT + "/requests/<request_id>")
@auth.requires(auth.READ)
def detail(agent_type: str, agent_name: str, request_id: str) -> str:
    agent = params.agent(agent_type, agent_name)
    request_id = params.identifier(request_id, "path.request_id")
    status = stored_status(agent, request_id)
    transcript = admin_data.transcript(agent, request_id)
    if status is None and transcript.last_seq < 0:
        raise ApiError(404, f"no request {request_id!r} for agent {agent.address}")
    return render_template(
        "think_jobs/detail.html",
        agent=agent,
        request_id=request_id,
        status=status or transcript.status,
        submission=agent.inspect_submission(request_id),
        asked=admin_data.asked(agent, request_id),
        approvals=admin_data.approvals_of(agent, request_id),
        transcript=transcript,
        stream_url=_stream_url(agent_type, agent_name, request_id, transcript.last_seq),
    )


@bp.post(AGENT + "/requests/<request_id>/cancel")
@auth.requires(auth.WRITE)
def cancel(agent_type: str, agent_name: str, request_id: str) -> ResponseReturnValue:
    agent = params.agent(agent_type, agent_name)
    request_id = params.identifier(request_id, "path.request_id")
    agent.cancel_chat(request_id, request.form.get("reason") or "cancelled from the admin page")
    flash(f"Cancel requested for {request_id}.", FLASH)
    return redirect(_back(agent_type, agent_name, request_id))


@bp.post(AGENT + "/approvals/<approval_id>/<decision>")
@auth.requires(auth.WRITE)
def answer(
    agent_type: str, agent_name: str, approval_id: str, decision: str
) -> ResponseReturnValue:
    """The Approve and Deny buttons of a turn that waits for a tool call's approval."""
    agent = params.agent(agent_type, agent_name)
    approval_id = params.identifier(approval_id, "path.approval_id")
    if decision not in DECISIONS:
        raise ApiError(404, f"no decision {decision!r}; expected approve or deny")
    reason = request.form.get("reason") or f"{DECISIONS[decision]} from the admin page"
    stored = agent.respond_to_approval(approval_id, decision == "approve", reason)
    flash(f"Approval {approval_id} is {stored.status.value}.", FLASH)
    return redirect(_back(agent_type, agent_name, stored.request_id))


DECISIONS = {"approve": "approved", "deny": "denied"}


@bp.post(AGENT + "/submissions/<submission_id>/delete")
@auth.requires(auth.WRITE)
def delete(agent_type: str, agent_name: str, submission_id: str) -> ResponseReturnValue:
    agent = params.agent(agent_type, agent_name)
    submission_id = params.identifier(submission_id, "path.submission_id")
    if agent.delete_submission(submission_id):
        flash(f"Deleted submission {submission_id}.", FLASH)
    else:
        flash(f"Submission {submission_id} was not deleted (it is not finished).", FLASH)
    return redirect(url_for(".submissions", agent_type=agent_type, agent_name=agent_name))


@bp.get(AGENT + "/schedules")
@auth.requires(auth.READ)
def schedules(agent_type: str, agent_name: str) -> str:
    agent = params.agent(agent_type, agent_name)
    try:
        next_runs: dict[str, Any] | None = agent.next_runs()
    except NotImplementedError:
        next_runs = None
    tasks = agent.get_scheduled_tasks()
    return render_template(
        "think_jobs/schedules.html", agent=agent, tasks=tasks, next_runs=next_runs
    )


@bp.post(AGENT + "/schedules/<task_id>/run")
@auth.requires(auth.WRITE)
def run_task(agent_type: str, agent_name: str, task_id: str) -> ResponseReturnValue:
    agent = params.agent(agent_type, agent_name)
    if task_id not in agent.get_scheduled_tasks():
        raise ApiError(404, f"{agent.agent_type} has no scheduled task {task_id!r}")
    result = agent.run_scheduled_task(task_id)
    flash(f"Ran {task_id} now.", FLASH)
    if result is not None:
        return redirect(_back(agent_type, agent_name, result.request_id))
    return redirect(url_for(".schedules", agent_type=agent_type, agent_name=agent_name))


def _stream_url(agent_type: str, agent_name: str, request_id: str, after_seq: int) -> str | None:
    try:
        return url_for(
            "think_jobs_api_streams.stream",
            agent_type=agent_type,
            agent_name=agent_name,
            request_id=request_id,
            after_seq=after_seq,
        )
    except BuildError:  # the streams blueprint is not mounted: no live view
        return None


def _back(agent_type: str, agent_name: str, request_id: str) -> str:
    target = _safe_next(request.form.get("next"))
    return target or url_for(
        ".detail", agent_type=agent_type, agent_name=agent_name, request_id=request_id
    )


def _safe_next(target: str | None) -> str | None:
    """Only same-site paths: ``/x`` yes; ``//evil``, ``https://evil``, ``/\\evil`` and paths
    with control characters (browsers drop tabs, turning ``/\t/evil`` into ``//evil``) no."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return None
    if "\\" in target or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return None
    return target
