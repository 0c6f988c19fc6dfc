"""JavaScript pages for a :class:`~devtools.testsite.TestSite`: the rendering tests' site
(issue 29). :func:`install_js_pages` adds these routes (``N`` a number)::

    /js/product/N   a shell whose script writes the product (h1.name, span.price)
    /js/listing     a shell whose script fetches /api/items (XHR) and writes each as li.item
    /api/items      the listing's items, JSON
    /js/scroll      infinite scroll: BATCH li.item at load, BATCH more each time the page is
                    scrolled to its bottom, forever (no end of the list)
    /js/redirect    a script sending the browser to /js/target (location.href)
    /js/target      the redirect's target, plain HTML (h1.name "target")
    /js/leaky       a page whose script tries XHR to private-range and link-local addresses
                    (LEAKY_TARGETS) and which has an <img> to one of them; its own h1.name is
                    plain HTML, and p.done is written once every XHR has ended. The render's
                    guard must refuse them all before any connection: nothing may go there.
    /js/slow        a shell whose script /js/slow.js is answered after SLOW_S seconds
                    (a render in progress for that long: the kill tests)
    /js/burst/N     a shell loading BURST_PARTS same-site scripts (/js/part/K.js), the last
                    writing span.count: 1 + BURST_PARTS requests per rendered page
    /plain/N        plain HTML with a lot of text (h1.name, span.price): no browser needed

Product pages and plain pages carry the same selectors, so one rule reads both.
"""

from __future__ import annotations

import json
import time

from devtools.testsite import RequestRecord, Response, TestSite

#: Where /js/leaky's script and image try to go: refused by the guard, never connected to.
LEAKY_TARGETS = ("http://10.0.0.1/", "http://192.168.1.1/",
                 "http://169.254.169.254/latest/meta-data/")
LEAKY_IMAGE = "http://169.254.169.254/latest/meta-data/pixel.png"
#: Items of /api/items, and of each infinite-scroll batch.
ITEMS = ("alpha", "beta", "gamma", "delta", "epsilon")
BATCH = 10
#: Scripts each /js/burst/N page loads.
BURST_PARTS = 6
#: How long /js/slow.js makes a render wait.
SLOW_S = 3.0
HTML = {"Content-Type": "text/html; charset=utf-8"}


def html(body: str, title: str = "js") -> Response:
    """A whole HTML document around ``body``."""
    return 200, HTML, (f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
                       f"{body}</body></html>").encode()


def product_shell(n: int) -> str:
    """The body of /js/product/N: nothing visible until its script runs."""
    return ("<div id=app></div><script>document.getElementById('app').innerHTML = "
            f"'<h1 class=name>product ' + {n} + '</h1><span class=price>{n}.50</span>';</script>")


def plain_page(n: int) -> str:
    return (f"<h1 class=name>plain {n}</h1><span class=price>{n}.25</span>"
            f"<p>{'plain text for reading ' * 30}</p>")


_LISTING = (
    "<ul id=list></ul><script>var x = new XMLHttpRequest();"
    " x.onload = function () { JSON.parse(x.responseText).forEach(function (t) {"
    " var li = document.createElement('li'); li.className = 'item'; li.textContent = t;"
    " document.getElementById('list').appendChild(li); });"
    " var h = document.createElement('h1'); h.className = 'name'; h.textContent = 'listing';"
    " document.body.appendChild(h); };"
    " x.open('GET', '/api/items'); x.send();</script>")

_SCROLL = (
    "<ul id=list></ul><script>var batches = 0;"
    " function more() { var list = document.getElementById('list');"
    f" for (var i = 0; i < {BATCH}; i++) {{ var li = document.createElement('li');"
    " li.className = 'item'; li.style.height = '120px';"
    f" li.textContent = 'item ' + (batches * {BATCH} + i); list.appendChild(li); }}"
    " batches += 1; document.body.setAttribute('data-batches', batches); }"
    " more();"
    " window.addEventListener('scroll', function () {"
    " if (window.innerHeight + window.scrollY >= document.body.scrollHeight - 20) more(); });"
    "</script>")

_LEAKY = (
    "<h1 class=name>leaky</h1><img src='" + LEAKY_IMAGE + "'><div id=out></div><script>"
    "var targets = " + json.dumps(list(LEAKY_TARGETS)) + "; var left = targets.length;"
    " targets.forEach(function (t) { var x = new XMLHttpRequest();"
    " x.onloadend = function () { left -= 1; if (left === 0) {"
    " var p = document.createElement('p'); p.className = 'done'; p.textContent = 'tried';"
    " document.getElementById('out').appendChild(p); } };"
    " x.open('GET', t); x.send(); });</script>")

_BURST = "<div id=app></div>" + "".join(
    f"<script src='/js/part/{k}.js'></script>" for k in range(BURST_PARTS))


def _part(k: int) -> str:
    """Script K of a burst page: counts itself; the last writes the page."""
    script = "window.parts = (window.parts || 0) + 1;"
    if k == BURST_PARTS - 1:
        script += (" document.getElementById('app').innerHTML = '<h1 class=name>burst</h1>"
                   "<span class=count>' + window.parts + '</span>';")
    return script


def install_js_pages(site: TestSite, *, products: int = 10, plain: int = 10) -> None:
    """Serve the pages listed in this module's docstring on ``site``."""
    json_headers = {"Content-Type": "application/json"}
    site.route("/api/items", lambda _r: (200, json_headers, json.dumps(list(ITEMS)).encode()))
    for n in range(products):
        site.route(f"/js/product/{n}", lambda _r, n=n: html(product_shell(n), f"product {n}"))
        site.route(f"/js/burst/{n}", lambda _r: html(_BURST, "burst"))
    for k in range(BURST_PARTS):
        site.route(f"/js/part/{k}.js", lambda _r, k=k: (
            200, {"Content-Type": "text/javascript"}, _part(k).encode()))
    for n in range(plain):
        site.route(f"/plain/{n}", lambda _r, n=n: html(plain_page(n), f"plain {n}"))
    site.route("/js/listing", lambda _r: html(_LISTING, "listing"))
    site.route("/js/scroll", lambda _r: html(_SCROLL, "scroll"))
    site.route("/js/redirect", lambda _r: html(
        "<script>location.href = '/js/target';</script>", "redirecting"))
    site.route("/js/target", lambda _r: html(
        "<h1 class=name>target</h1><span class=price>7.00</span>", "target"))
    site.route("/js/leaky", lambda _r: html(_LEAKY, "leaky"))
    site.route("/js/slow", lambda _r: html(
        "<div id=app></div><script src='/js/slow.js'></script>", "slow"))
    site.route("/js/slow.js", _slow_script)


def _slow_script(_record: RequestRecord) -> Response:
    time.sleep(SLOW_S)
    return 200, {"Content-Type": "text/javascript"}, (
        b"document.getElementById('app').innerHTML = '<h1 class=name>slow</h1>';")
