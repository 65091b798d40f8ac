// A minimal DOM for running the dashboard's script under Node (no browser in CI).
// Usage: node dashboard_dom.js <script.js> <page-url>; prints the rendered elements as JSON.
"use strict";
const fs = require("fs");
const [scriptPath, pageUrl] = process.argv.slice(2);

class Element {
  constructor(tag) { this.tag = tag; this.children = []; this._text = ""; this.style = {}; this.className = ""; this.value = ""; }
  set textContent(value) { this._text = String(value); this.children = []; }  // browsers store text
  get textContent() { return this._text; }
  append(...nodes) { this.children.push(...nodes); }
  replaceChildren(...nodes) { this.children = [...nodes]; }
  addEventListener() {}
  get text() { return this.children.length ? this.children.map((c) => c.text) : this.textContent; }
}
const elements = {};
const url = new URL(pageUrl);
global.document = {
  getElementById: (id) => (elements[id] ??= new Element("#" + id)),
  createElement: (tag) => new Element(tag),
};
global.location = { pathname: url.pathname, hash: url.hash, href: url.href };
global.history = { replaceState: (_s, _t, path) => { location.hash = ""; location.pathname = path; } };
const storage = {};
global.sessionStorage = { getItem: (k) => storage[k] ?? null, setItem: (k, v) => { storage[k] = String(v); } };
global.setInterval = () => 0;
const realFetch = global.fetch;
global.fetch = (path, init) => realFetch(url.origin + path, init);

eval(fs.readFileSync(scriptPath, "utf8"));
setTimeout(() => {
  const out = {};
  for (const [id, el] of Object.entries(elements)) out[id] = el.text;
  out.login_display = elements.login ? elements.login.style.display : undefined;
  console.log(JSON.stringify(out));
}, 1500);
