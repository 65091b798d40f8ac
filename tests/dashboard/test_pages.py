"""The dashboard in headless Chromium against a real small training run: every page renders without
console errors, filters change the list, a rollout opens to its spans and transitions, a chart gains a
point when a step lands, and requests without the token are refused."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from playwright.sync_api import Page, Response, Route, expect

from reinforge.store.run_files import METRICS_FILE, TRANSITIONS_FILE

from .conftest import Console, Served

CURATED_CHARTS = [
    "Reward",
    "Success",
    "Steps per second",
    "Policy version",
    "Entropy",
    "KL",
    "Clip fraction",
    "Merge rate",
    "AIR signals",
]


def api(served: Served, path: str, **params: Any) -> Any:
    response = httpx.get(
        f"{served.url}/dashboard/api{path}",
        params=params,
        headers={"Authorization": f"Bearer {served.token}"},
    )
    assert response.status_code == 200, response.text
    return response.json()


def chart_points(page: Page, title: str) -> int:
    return int(page.locator(f'.chart[data-title="{title}"]').get_attribute("data-points") or "0")


def test_run_page_draws_the_runs_curves(page: Page, served: Served, console: Console) -> None:
    page.goto(served.page_url)
    expect(page.locator('.chart[data-title="Reward"] canvas')).to_be_visible()
    titles = page.locator(".chart").evaluate_all("(els) => els.map((e) => e.dataset.title)")
    assert titles[: len(CURATED_CHARTS)] == CURATED_CHARTS
    assert {"adv", "time", "update"} <= set(titles)  # every other logged metric, grouped by prefix
    steps = [r for r in api(served, "/metrics")["records"] if "train/reward" in r]
    assert chart_points(page, "Reward") >= len(steps) >= 2
    assert chart_points(page, "Policy version") == len(steps)
    assert chart_points(page, "Steps per second") == len(steps)
    assert chart_points(page, "Entropy") == len(steps)
    assert chart_points(page, "Merge rate") == len(steps)
    assert page.locator("#run-cards .card").first.locator(".v").inner_text() == str(steps[-1]["step"])
    expect(page.locator("#live")).to_have_text("live")
    assert "token=" not in page.url  # the token left the address bar
    served.screenshot(page, "run")
    assert console.errors == []


def test_a_chart_gains_a_point_when_a_step_lands(page: Page, served: Served, console: Console) -> None:
    page.goto(served.page_url)
    expect(page.locator("#live")).to_have_text("live")
    before = chart_points(page, "Reward")
    page.evaluate("window.__notReloaded = true")
    records = [json.loads(line) for line in (served.run_dir / METRICS_FILE).read_text().splitlines()]
    last = [r for r in records if "train/reward" in r][-1]
    # The trainer's own record format, one step later, appended as the trainer appends it.
    landed = {
        **last,
        "step": last["step"] + 1,
        "policy_version": last["policy_version"] + 1,
        "train/reward": 0.75,
    }
    with (served.run_dir / METRICS_FILE).open("a", encoding="utf-8") as f:
        f.write(json.dumps(landed) + "\n")
    expect(page.locator('.chart[data-title="Reward"]')).to_have_attribute("data-points", str(before + 1))
    assert page.evaluate("window.__notReloaded") is True
    assert page.locator("#run-cards .card").first.locator(".v").inner_text() == str(landed["step"])
    assert console.errors == []


def rows(page: Page) -> list[dict[str, str]]:
    """The rows of the latest load: the table is busy from a load's start until it has rendered it."""
    page.wait_for_function(
        """document.querySelector('#rollout-table[aria-busy="false"] table,'
        + ' #rollout-table[aria-busy="false"] #no-rollouts') !== null"""
    )
    return page.locator("#rollout-table tbody tr").evaluate_all(
        """(trs) => trs.map((tr) => ({id: tr.dataset.rollout, status: tr.children[1].innerText,
            mode: tr.children[2].innerText, version: tr.children[3].innerText,
            reward: tr.children[4].innerText, task: tr.children[6].innerText}))"""
    )


def apply_filters(page: Page, **fields: str) -> None:
    for name, value in fields.items():
        page.locator(f'#filters [name="{name}"]').fill(value)

    def filtered(response: Response) -> bool:
        query = parse_qs(urlsplit(response.url).query)
        return "/dashboard/api/rollouts" in response.url and all(
            query.get(name) == [value] for name, value in fields.items()
        )

    with page.expect_response(filtered):
        page.locator('#filters button[type="submit"]').click()


def test_rollouts_filters_change_what_is_listed(page: Page, served: Served, console: Console) -> None:
    page.goto(served.page_url)
    page.locator('nav a[data-nav="rollouts"]').click()
    everything = rows(page)
    listed = api(served, "/rollouts", limit=1000)["items"]
    assert [r["id"] for r in everything] == [r["rollout_id"] for r in listed[:50]]
    assert {r["mode"] for r in everything} == {"train", "val"}
    served.screenshot(page, "rollouts")

    with page.expect_response(lambda r: "mode=val" in r.url):
        page.locator('#filters [name="mode"]').select_option("val")
    val = rows(page)
    assert val and {r["mode"] for r in val} == {"val"}
    assert len(val) == sum(r["mode"] == "val" for r in listed)

    page.goto(f"{served.url}/dashboard#/rollouts")
    apply_filters(page, reward_min="1", reward_max="1")
    rewarded = rows(page)
    assert rewarded and all(float(r["reward"]) == 1.0 for r in rewarded)
    assert len(rewarded) == sum(r["reward"] == 1.0 for r in listed)

    page.goto(f"{served.url}/dashboard#/rollouts")
    apply_filters(page, policy_version="1")
    assert {r["version"] for r in rows(page)} == {"1"}

    question = next(r for r in listed if r["mode"] == "train")["task_preview"].split('"question": ')[1][1:-2]
    page.goto(f"{served.url}/dashboard#/rollouts")
    apply_filters(page, task=question)
    by_task = rows(page)
    assert by_task and all(question in r["task"] for r in by_task)
    assert len(by_task) == sum(question in r["task_preview"] for r in listed)

    page.goto(f"{served.url}/dashboard#/rollouts")
    apply_filters(page, agent="solver")
    assert len(rows(page)) == min(50, len(listed))
    apply_filters(page, agent="nobody")
    expect(page.locator("#no-rollouts")).to_have_text("No rollouts match.")
    assert console.errors == []


def test_a_late_answer_does_not_replace_a_newer_filter(page: Page, served: Served, console: Console) -> None:
    held: list[Route] = []

    def hold_unfiltered(route: Route) -> None:
        if "mode=" in route.request.url:
            route.continue_()
        else:
            held.append(route)

    page.route(lambda url: "/dashboard/api/rollouts?" in url, hold_unfiltered)
    page.goto(served.page_url)
    with page.expect_request(lambda r: "/dashboard/api/rollouts" in r.url):
        page.locator('nav a[data-nav="rollouts"]').click()
    with page.expect_response(lambda r: "mode=val" in r.url):
        page.locator('#filters [name="mode"]').select_option("val")
    assert {r["mode"] for r in rows(page)} == {"val"}

    assert len(held) == 1  # the first, unfiltered load: it answers only now, after the filtered one
    with page.expect_response(lambda r: "/dashboard/api/rollouts" in r.url and "mode=" not in r.url):
        held[0].continue_()
    page.evaluate("() => new Promise((done) => setTimeout(done, 200))")  # let the page handle that answer
    assert {r["mode"] for r in rows(page)} == {"val"}
    assert console.errors == []


def test_an_answer_after_the_reader_left_does_not_replace_the_page(
    page: Page, served: Served, console: Console
) -> None:
    rollout_id = api(served, "/rollouts", limit=1)["items"][0]["rollout_id"]
    held: list[Route] = []
    page.route(lambda url: "/dashboard/api/rollout?" in url, lambda route: held.append(route))
    page.goto(served.page_url)
    with page.expect_request(lambda r: "/dashboard/api/rollout?" in r.url):
        page.goto(f"{served.url}/dashboard#/rollout/{rollout_id}")
    page.locator('nav a[data-nav="rollouts"]').click()  # before the rollout's answer
    rows(page)

    with page.expect_response(lambda r: "/dashboard/api/rollout?" in r.url):
        held[0].continue_()
    page.evaluate("() => new Promise((done) => setTimeout(done, 200))")  # let the page handle that answer
    expect(page.locator("#view h1")).to_have_text("Rollouts")
    assert page.locator("#trace, #no-spans").count() == 0
    assert console.errors == []


def test_the_runners_poll_does_not_start_when_the_reader_left_first(
    page: Page, served: Served, console: Console
) -> None:
    held: list[Route] = []
    page.route(lambda url: "/dashboard/api/runners" in url, lambda route: held.append(route))
    page.goto(served.page_url)
    with page.expect_request(lambda r: "/dashboard/api/runners" in r.url):
        page.locator('nav a[data-nav="runners"]').click()
    page.locator('nav a[data-nav="rollouts"]').click()  # before the runners' first answer
    rows(page)

    polled: list[str] = []
    page.on("request", lambda r: polled.append(r.url) if "/dashboard/api/runners" in r.url else None)
    with page.expect_response(lambda r: "/dashboard/api/runners" in r.url):
        held[0].continue_()
    page.wait_for_timeout(3_500)  # longer than the page's 3 s poll
    assert polled == []
    assert console.errors == []


def test_a_rollout_opens_to_its_spans_and_transitions(page: Page, served: Served, console: Console) -> None:
    transitions = [json.loads(x) for x in (served.run_dir / TRANSITIONS_FILE).read_text().splitlines()]
    merged = next(t for t in transitions if any(not s["trained"] for s in t["segments"]))
    rollout_id = merged["rollout_id"]
    detail = api(served, "/rollout", rollout_id=rollout_id)
    page.goto(served.page_url)
    page.locator('nav a[data-nav="rollouts"]').click()
    rows(page)
    page.goto(f"{served.url}/dashboard#/rollout/{rollout_id}")
    expect(page.locator("#trace .row").first).to_be_visible()
    assert page.locator("#trace .row").count() == len(detail["spans"])
    kinds = page.locator("#trace .row").evaluate_all("(rs) => rs.map((r) => r.dataset.kind)")
    assert kinds.count("llm") == 2 and "tool" in kinds and "reward" in kinds

    llm = next(s for s in detail["spans"] if s["kind"] == "llm" and len(s["llm"]["messages"]) > 1)
    page.locator(f'#trace .row[data-span="{llm["span_id"]}"]').click()
    shown = page.locator(f'#trace .row[data-span="{llm["span_id"]}"] + .detail')
    expect(shown.locator("pre.response")).to_have_text(llm["llm"]["response_text"])
    expect(shown.locator(".msg .role").first).to_have_text("user")
    shown.locator("button.logprobs").click()
    expect(shown.locator(".tok")).to_have_count(llm["llm"]["completion_tokens"])

    tool = next(s for s in detail["spans"] if s["kind"] == "tool")
    page.locator(f'#trace .row[data-span="{tool["span_id"]}"]').click()
    expect(page.locator(f'#trace .row[data-span="{tool["span_id"]}"] + .detail pre.attrs')).to_contain_text(
        "reinforge.tool.name"
    )

    mine = [t for t in transitions if t["rollout_id"] == rollout_id]
    expect(page.locator("#transitions tr.transition")).to_have_count(len(mine))
    advantages = page.locator("#transitions td.advantage").all_inner_texts()
    assert advantages == [f"{t['advantage']:.4f}" for t in sorted(mine, key=lambda t: t["index"])]
    masked = page.locator("#transitions .segments .seg.masked").all_inner_texts()
    assert masked and masked[0] == next(s["text"] for s in merged["segments"] if not s["trained"])
    served.screenshot(page, "rollout")
    assert console.errors == []


def test_a_failed_tool_call_shows_its_error_and_air_signal(
    page: Page, served: Served, console: Console
) -> None:
    refused = api(served, "/rollouts", task="0+0*2", mode="train")["items"][0]["rollout_id"]
    detail = api(served, "/rollout", rollout_id=refused)
    tool = next(s for s in detail["spans"] if s["kind"] == "tool")
    assert tool["status"] == "error" and tool["air_signal"] == "tool_error"
    page.goto(served.page_url)
    page.goto(f"{served.url}/dashboard#/rollout/{refused}")
    row = page.locator(f'#trace .row[data-span="{tool["span_id"]}"]')
    expect(row).to_contain_text("AIR tool_error")
    row.click()
    expect(
        page.locator(f'#trace .row[data-span="{tool["span_id"]}"] + .detail pre.error-text')
    ).to_contain_text("calculator takes exactly")
    sources = page.locator("#transitions tr.transition td.mono").all_inner_texts()
    assert sources and all("air" in s for s in sources)
    assert console.errors == []


def test_runners_page_lists_runners_and_heartbeats(page: Page, served: Served, console: Console) -> None:
    page.goto(served.page_url)
    page.locator('nav a[data-nav="runners"]').click()
    expect(page.locator('#runners tr[data-runner="trainer-runner-0"]')).to_be_visible()
    runners = api(served, "/runners")
    assert page.locator("#runners tbody tr").count() == len(runners["runners"])
    attempts = page.locator('#runners tr[data-runner="trainer-runner-0"] td').nth(1).inner_text()
    assert int(attempts) == runners["runners"][0]["attempts"] > 0
    expect(page.locator("#running")).to_contain_text("No attempt is running.")
    served.screenshot(page, "runners")
    assert console.errors == []


def test_requests_without_the_token_are_refused(page: Page, served: Served) -> None:
    for path in ("/overview", "/metrics", "/rollouts", "/rollout?rollout_id=x", "/runners", "/events"):
        assert httpx.get(f"{served.url}/dashboard/api{path}").status_code == 401, path
        wrong = {"Authorization": "Bearer wrong"}
        assert httpx.get(f"{served.url}/dashboard/api{path}", headers=wrong).status_code == 401, path
    # The query-parameter token is the event stream's alone.
    assert (
        httpx.get(f"{served.url}/dashboard/api/overview", params={"token": served.token}).status_code == 401
    )
    assert httpx.get(f"{served.url}/dashboard/api/events", params={"token": "wrong"}).status_code == 401
    with httpx.stream("GET", f"{served.url}/dashboard/api/events", params={"token": served.token}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        first = next(stream.iter_lines())
        assert first == "retry: 1000"
    # The page itself holds no data and needs no token; without one it asks for it and shows nothing.
    page.goto(f"{served.url}/dashboard")
    expect(page.locator("#login")).to_be_visible()
    assert page.locator("#view").inner_text() == ""


def test_bad_filters_are_refused_with_a_message(served: Served) -> None:
    headers = {"Authorization": f"Bearer {served.token}"}
    bad = httpx.get(f"{served.url}/dashboard/api/rollouts?reward_min=2&reward_max=1", headers=headers)
    assert bad.status_code == 400 and "reward_min" in bad.json()["error"]["message"]
    assert httpx.get(f"{served.url}/dashboard/api/rollouts?status=nope", headers=headers).status_code == 422
    assert httpx.get(f"{served.url}/dashboard/api/rollouts?limit=0", headers=headers).status_code == 422
    misspelt = httpx.get(f"{served.url}/dashboard/api/rollouts?staus=failed", headers=headers)
    assert misspelt.status_code == 400 and "'staus'" in misspelt.json()["error"]["message"]
    twice = httpx.get(f"{served.url}/dashboard/api/metrics?since=1&since=9", headers=headers)
    assert twice.status_code == 400 and "'since' given 2 times" in twice.json()["error"]["message"]
    statuses = "status=failed&status=succeeded"
    assert httpx.get(f"{served.url}/dashboard/api/rollouts?{statuses}", headers=headers).status_code == 200
    missing = httpx.get(f"{served.url}/dashboard/api/rollout?rollout_id=nope", headers=headers)
    assert missing.status_code == 404
    assert httpx.get(f"{served.url}/dashboard/assets/../index.html").status_code == 404
