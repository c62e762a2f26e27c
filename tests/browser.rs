//! `session-store serve` in a real browser (issue 16): headless Debian Chromium, run as a
//! process (`--dump-dom`, `--screenshot`), against a server over the demo root with forks
//! and a hostile message appended by the test. The dumped DOM (after the browser parsed
//! the page, applied the CSP and ran whatever scripts it would run) shows: the demo's
//! titles on the sessions page, a session's messages, one node per session of a lineage
//! on the fork tree page, and a hostile message that ran no script and is shown as text.
//! The root's storage page draws its three charts. Screenshots of five pages (sessions, a
//! session, a fork tree, its storage, the root's storage) are taken (and written to `$SESSION_STORE_SCREENSHOTS`, e.g.
//! `docs/screenshots`, when set).
//!
//! Chromium (`/usr/bin/chromium`, or `$CHROMIUM`) is installed by `.ci/run`; without it the
//! test fails when `$CI` is set and is skipped with a message otherwise.

mod serve_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serve_support::{DEMO, Server, cli_ok, demo_root, pages};

/// The browser, if installed.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    path.is_file().then_some(path)
}

/// The browser; without it the test fails under `$CI` and is skipped (`None`) otherwise.
fn chromium_or_skip() -> Option<PathBuf> {
    let bin = chromium();
    if bin.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is missing (/usr/bin/chromium or $CHROMIUM): .ci/run installs it"
        );
        println!("browser test skipped: no /usr/bin/chromium (apt-get install chromium)");
    }
    bin
}

/// A headless Chromium with its own profile folder.
fn browser(bin: &Path, profile: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--virtual-time-budget=3000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

/// The DOM of `url` after Chromium loaded it.
fn dump_dom(bin: &Path, profile: &Path, url: &str) -> String {
    let out = browser(bin, profile)
        .args(["--dump-dom", url])
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium --dump-dom {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 DOM")
}

/// A 1200x800 screenshot of `url` into `file`.
fn screenshot(bin: &Path, profile: &Path, url: &str, file: &Path) {
    let out = browser(bin, profile)
        .arg(format!("--screenshot={}", file.display()))
        .args(["--window-size=1200,800", url])
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium --screenshot {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(file).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        file.display()
    );
}

/// `session-store append ARGS… --file F` of `batch` (written to F in `dir`).
fn append(root: &Path, dir: &Path, batch: &serde_json::Value, args: &[&str]) {
    let input = dir.join("batch.jsonl");
    std::fs::write(&input, format!("{batch}\n")).expect("write the batch");
    let mut all = vec!["append"];
    all.extend(args);
    all.extend(["--file", input.to_str().expect("utf-8 path")]);
    cli_ok(root, &all);
}

/// What the hostile message would do if it ran: change the title, add an element.
const HOSTILE: &str = "<script>document.title='pwned';document.body.append(Object.assign(\
    document.createElement('div'),{id:'pwned'}))</script>\
    <img src=x onerror=\"document.title='pwned'\"><a href=\"javascript:document.title='pwned'\">go</a>";

#[test]
fn pages_render_in_headless_chromium_and_hostile_content_runs_no_script() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let (dir, root) = demo_root();
    let batch = serde_json::json!({
        "operation_id": "hostile",
        "events": [{"kind": "message/complete",
                    "payload": {"message": {"id": "evil", "role": "user", "content": HOSTILE}}}],
    });
    append(&root, dir.path(), &batch, &["demo-query-plan"]);
    let server = Server::start(&root, &[]);
    let profile = dir.path().join("chromium-profile");
    let url = |path: &str| format!("{}{path}", server.base);

    let sessions = dump_dom(&bin, &profile, &url("/"));
    for (_, title) in DEMO {
        assert!(
            sessions.contains(title),
            "{title:?} not on the sessions page"
        );
    }

    let session = dump_dom(&bin, &profile, &url("/sessions/demo-flaky-test"));
    for text in [
        "The CI keeps failing on tokens::nested_quotes about one run in ten.",
        "I'll run the test suite a few times and look at the failing test.",
        "Done: the test now uses its own temp dir and passed 50 runs in a row.",
    ] {
        assert!(session.contains(text), "{text:?} not on the session page");
    }
    assert!(session.contains("<details class=\"tool-call\">"));

    // The lineage of flaky-fork: its parent, itself, its sibling rewind and its own fork.
    let tree = dump_dom(&bin, &profile, &url("/sessions/flaky-fork/tree"));
    let nodes: Vec<&str> = tree
        .split("<g class=\"node ")
        .skip(1)
        .filter_map(|s| s.split("data-id=\"").nth(1)?.split('"').next())
        .collect();
    let mut sorted = nodes.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "demo-flaky-test",
            "flaky-fork",
            "flaky-fork-2",
            "flaky-rewind"
        ],
        "one node per session of the lineage"
    );

    let hostile = dump_dom(&bin, &profile, &url("/sessions/demo-query-plan"));
    assert!(!hostile.contains("pwned</title>"), "the hostile script ran");
    assert!(!hostile.contains("id=\"pwned\""), "the hostile script ran");
    assert!(hostile.contains("<title>Why is the orders query slow? · session-store</title>"));
    assert!(
        !hostile.to_ascii_lowercase().contains("<img"),
        "an image element was created"
    );
    // (Text nodes are serialized with `<` escaped, so a tag in the dump is a real element.)
    assert!(
        !hostile.contains("<a href=\"javascript:"),
        "a javascript: link was created"
    );
    assert!(
        hostile.contains("&lt;script&gt;document.title='pwned'"),
        "the hostile text is not shown as text"
    );

    // The root's storage page: three charts drawn, the totals of the 8 sessions.
    let stats = dump_dom(&bin, &profile, &url("/stats"));
    assert_eq!(stats.matches("<svg class=\"bars\"").count(), 3, "{stats}");
    assert!(stats.contains("8 sessions") && stats.contains("session files"));
    assert!(
        sessions.contains("href=\"/stats\""),
        "no Storage link in the nav"
    );

    let shots = std::env::var_os("SESSION_STORE_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.path().join("screenshots"));
    std::fs::create_dir_all(&shots).expect("screenshots folder");
    for (name, path) in [
        ("sessions.png", "/"),
        ("session.png", "/sessions/demo-flaky-test"),
        ("fork-tree.png", "/sessions/flaky-fork/tree"),
        ("stats.png", "/sessions/demo-flaky-test/stats"),
        ("root-stats.png", "/stats"),
    ] {
        screenshot(&bin, &profile, &url(path), &shots.join(name));
    }
}

/// Marks the `<body>` of a page with the elements that stick out past the right edge of
/// the window (`data-wider="TAG.class@right …"`, or `none`), once Chromium laid it out.
const MEASURE: &str = "<script>const w=document.documentElement.clientWidth;const out=[];\
    for(const e of document.querySelectorAll('body *')){const r=e.getBoundingClientRect();\
    const p=e.parentElement&&e.parentElement.getBoundingClientRect();\
    if(r.right>w+1&&!(p&&p.right>w+1))out.push(e.tagName+'.'+e.className+'@'+Math.round(r.right));}\
    document.body.setAttribute('data-wider',out.join(' ')||'none');</script>";

#[test]
fn long_words_from_a_session_never_make_a_page_wider_than_the_window() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let (dir, root) = demo_root();
    // Words without a break point wherever a session's text is shown: a title, a
    // message, a message id, a tool call's name and id, a working directory.
    let word = "W".repeat(5_000);
    let batch = serde_json::json!({
        "operation_id": "wide",
        "events": [
            {"kind": "session/title", "payload": {"title": format!("needle {}", &word[..1_000])}},
            {"kind": "message/complete", "payload": {"message": {
                "id": "i".repeat(2_000), "role": "user", "content": format!("needle {word} tail")}}},
            {"kind": "message/complete", "payload": {"message": {
                "id": "call", "role": "assistant", "content": "calling",
                "tool_calls": [{"id": "c".repeat(2_000), "type": "function",
                                "function": {"name": "n".repeat(2_000), "arguments": "{}"}}]}}},
        ],
    });
    let cwd = format!("/{}", "d".repeat(2_000));
    cli_ok(&root, &["create", "wide", "--cwd", &cwd]);
    append(&root, dir.path(), &batch, &["wide"]);
    let server = Server::start(&root, &[]);
    for path in &pages("wide", "needle") {
        let wider = laid_out(&bin, dir.path(), &server, path, MEASURE, "data-wider");
        assert_eq!(wider, "none", "{path} is wider than the window");
    }
}

/// Opens every `<details>` of the page, lays it out and marks the `<body>` with the
/// milliseconds that took (`data-open-ms`).
const OPEN_ALL: &str = "<script>const t0=performance.now();\
    for(const d of document.querySelectorAll('details'))d.open=true;\
    document.body.offsetHeight;\
    document.body.setAttribute('data-open-ms',String(Math.round(performance.now()-t0)));</script>";

/// A long run of one letter (base64 of zeros: `AAAA…`) does not freeze the page when it is
/// opened: with kerning, Chromium laid out 200 KB of `A` in 8-13 s and 50 KB in 3.8 s, a
/// frozen tab (30 ms without; outside testing D5, session 42). A hang guard, not a speed
/// target: the bound is far from both figures (150 KB here: 4.6 s with kerning, 42 ms without).
#[test]
fn a_long_run_of_one_letter_opens_without_freezing_the_page() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let (dir, root) = demo_root();
    let batch = serde_json::json!({
        "operation_id": "zeros",
        "events": [{"kind": "message/complete", "payload": {"message": {
            "id": "b64", "role": "user", "content": "A".repeat(150_000)}}}],
    });
    cli_ok(&root, &["create", "zeros"]);
    append(&root, dir.path(), &batch, &["zeros"]);
    let server = Server::start(&root, &[]);
    // Stored as a blob: the transcript links its own page, which folds it.
    let page = server.ok("/sessions/zeros").body;
    let content = page
        .split("href=\"")
        .map(|rest| rest.split('"').next().unwrap_or(""))
        .find(|href| href.starts_with("/sessions/zeros/content/"))
        .unwrap_or_else(|| panic!("no content link: {page}"))
        .to_owned();
    assert!(
        server.ok(&content).body.contains("<details"),
        "{content} is not folded"
    );
    let ms = laid_out(
        &bin,
        dir.path(),
        &server,
        &content,
        OPEN_ALL,
        "data-open-ms",
    );
    let ms: u64 = ms.parse().unwrap_or_else(|_| panic!("not laid out: {ms}"));
    assert!(ms < 2_000, "opening the message took {ms} ms");
}

/// Lays out page `path` of `server` in Chromium (1200x800) with `script` added and
/// returns the value `script` gave the `<body>`'s attribute `attribute`. The page as
/// served, its stylesheet inlined (the served page's CSP runs no inline script, so it is
/// opened from a file).
fn laid_out(
    bin: &Path,
    dir: &Path,
    server: &Server,
    path: &str,
    script: &str,
    attribute: &str,
) -> String {
    let css = server.ok("/assets/style.css").body;
    let page = server.ok(path).body;
    let link = "<link rel=\"stylesheet\" href=\"/assets/style.css\">";
    assert!(page.contains(link) && page.contains("</body>"), "{path}");
    let page = page
        .replace(link, &format!("<style>{css}</style>"))
        .replace("</body>", &format!("{script}</body>"));
    let file = dir.join("laid-out.html");
    std::fs::write(&file, page).expect("write the page");
    let out = browser(bin, &dir.join("chromium-profile"))
        .args(["--window-size=1200,800", "--dump-dom"])
        .arg(format!("file://{}", file.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    dom.split(&format!("{attribute}=\""))
        .nth(1)
        .and_then(|d| d.split('"').next())
        .unwrap_or("not laid out")
        .to_owned()
}

/// Marks the `<body>` with the rows whose parts are not laid out left to right in their
/// order (`data-reordered="…"`, or `none`): a search hit's title, role, position and time,
/// a message's role, permalink and id.
const REORDERED: &str = "<script>const bad=[];\
    for(const row of document.querySelectorAll('li.hit, article.message header')){\
    const xs=[...row.children].filter(e=>e.tagName!=='P').map(e=>e.getBoundingClientRect().left);\
    for(let i=1;i<xs.length;i++)if(xs[i]<xs[i-1])bad.push(row.tagName+':'+row.textContent.slice(0,60));}\
    document.body.setAttribute('data-reordered',bad.join(' | ')||'none');</script>";

#[test]
fn a_bidi_override_in_a_session_never_reorders_the_pages_own_text() {
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let (dir, root) = demo_root();
    // Right-to-left overrides (U+202E) left open in a title, a role and a message id: they
    // must not turn the page's own text after them (role, position, time) around.
    let batch = serde_json::json!({
        "operation_id": "bidi",
        "events": [
            {"kind": "session/title", "payload": {"title": "Budget plan \u{202e}"}},
            {"kind": "message/complete", "payload": {"message": {
                "id": "r1\u{202e}", "role": "user", "content": "budget notes"}}},
            {"kind": "message/complete", "payload": {"message": {
                "id": "r2", "role": "us\u{202e}er", "content": "budget again"}}},
        ],
    });
    append(&root, dir.path(), &batch, &["bidi", "--create"]);
    let server = Server::start(&root, &[]);
    for path in ["/?q=budget", "/sessions/bidi"] {
        let reordered = laid_out(&bin, dir.path(), &server, path, REORDERED, "data-reordered");
        assert_eq!(reordered, "none", "{path}");
    }
}

/// Marks the `<body>` with the text that has less contrast with the background behind it
/// than WCAG AA asks of normal text, 4.5:1 (`data-low-contrast="TAG.class 'text' ratio …"`,
/// or `none`): every element with text of its own, its color against the first opaque
/// background of it or its ancestors (white at the top).
const CONTRAST: &str = "<script>const rgb=s=>{const m=s.match(/[\\d.]+/g).map(Number);\
    return{c:m.slice(0,3),a:m.length>3?m[3]:1};};\
    const lum=c=>{const v=c.map(x=>{x/=255;return x<=0.03928?x/12.92:Math.pow((x+0.055)/1.055,2.4);});\
    return 0.2126*v[0]+0.7152*v[1]+0.0722*v[2];};const low=[];\
    for(const e of document.querySelectorAll('body *')){\
    const own=[...e.childNodes].some(n=>n.nodeType===3&&n.textContent.trim());if(!own)continue;\
    const st=getComputedStyle(e);if(st.display==='none'||e.closest('svg'))continue;\
    let b=e,bg=null;while(b){const c=rgb(getComputedStyle(b).backgroundColor);if(c.a>0){bg=c.c;break;}b=b.parentElement;}\
    bg=bg||[255,255,255];const a=lum(rgb(st.color).c),z=lum(bg);\
    const r=(Math.max(a,z)+0.05)/(Math.min(a,z)+0.05);\
    if(r<4.5)low.push(e.tagName+'.'+e.className+' '+JSON.stringify(e.textContent.trim().slice(0,20))+' '+r.toFixed(2));}\
    document.body.setAttribute('data-low-contrast',low.join(' | ')||'none');</script>";

#[test]
fn every_page_s_text_has_the_contrast_wcag_aa_asks_for() {
    // The muted grey of a message's id, permalink and time (12 px) had 4.34:1 against a
    // user message's background and 4.43:1 against an assistant's, under the 4.5:1 WCAG AA
    // asks of normal text.
    let Some(bin) = chromium_or_skip() else {
        return;
    };
    let (dir, root) = demo_root();
    let server = Server::start(&root, &[]);
    for path in &pages("demo-flaky-test", "test") {
        let low = laid_out(
            &bin,
            dir.path(),
            &server,
            path,
            CONTRAST,
            "data-low-contrast",
        );
        assert_eq!(low, "none", "{path}: text under 4.5:1");
    }
}
