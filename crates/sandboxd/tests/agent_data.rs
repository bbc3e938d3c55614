//! The data profile end to end: `sandboxd run --agent data --input sales.xlsx` with the real
//! binary, engine and image, the LLM scripted at the HTTP boundary. The model's python reads
//! the sheet with pandas, computes with scipy, saves a seaborn PNG and a plotly HTML, and all
//! three come out; the HTML draws its SVG in the host's Chromium with no network (plotly.js
//! is embedded). And Chinese text is drawn with the CJK font, not as tofu: in a matplotlib
//! plot, and in a plotly chart shot by the image's Chromium (its templates name the font).
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use crate::support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use support::cli::sandboxd;
use support::fake_llm::{FakeLlm, Reply, check_tool_pairing, last_of_role};
use support::web_browser::{WebBrowser, goto, wait_for};

const ADS: [f64; 12] = [
    10.0, 12.0, 9.0, 15.0, 18.0, 14.0, 20.0, 22.0, 17.0, 25.0, 27.0, 30.0,
];
const NOISE: [f64; 12] = [
    1.5, -2.0, 0.5, 3.0, -1.0, 2.5, -3.0, 1.0, 0.0, -2.5, 2.0, -1.5,
];

fn sales() -> Vec<f64> {
    ADS.iter()
        .zip(NOISE)
        .map(|(a, n)| 3.0 * a + 40.0 + n)
        .collect()
}

fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let cov: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
    let vy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
    cov / (vx * vy).sqrt()
}

/// Runs `python3 -c script` in a fresh sandbox of the real image; its stdout.
fn in_sandbox(dir: &Path, script: &str) -> String {
    let out = sandboxd(dir)
        .args(["exec", "--", "python3", "-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exec failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// sales.xlsx, written by the image's own openpyxl (the host has none), with a Chinese
/// sheet name and column.
fn write_workbook(dir: &Path) -> std::path::PathBuf {
    let script = format!(
        "import base64, io\nimport pandas as pd\n\
         df = pd.DataFrame({{'月份': [f'{{m}}月' for m in range(1, 13)], 'month': list(range(1, 13)), \
         'ads': {ads:?}, 'sales': {sales:?}}})\n\
         buf = io.BytesIO()\ndf.to_excel(buf, sheet_name='销售', index=False)\n\
         print(base64.b64encode(buf.getvalue()).decode())",
        ads = ADS.to_vec(),
        sales = sales(),
    );
    let b64 = in_sandbox(dir, &script);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .unwrap();
    assert_eq!(&bytes[..2], b"PK", "an xlsx is a zip");
    let path = dir.join("sales.xlsx");
    std::fs::write(&path, bytes).unwrap();
    path
}

const ANALYSIS: &str = r#"import os
import pandas as pd
from scipy import stats
import seaborn as sns
import matplotlib.pyplot as plt
import plotly.express as px
df = pd.read_excel("/workspace/sales.xlsx", sheet_name="销售")
r, p = stats.pearsonr(df["ads"], df["sales"])
os.makedirs("/workspace/charts", exist_ok=True)
ax = sns.regplot(data=df, x="ads", y="sales")
ax.set_title("广告投入与销售额")
plt.savefig("/workspace/charts/sales.png")
plt.close("all")
fig = px.line(df, x="月份", y="sales", title="月度销售额")
fig.write_html("/workspace/charts/sales.html", include_plotlyjs=True)
print(f"rows={len(df)} r={r:.4f} p<0.001={p < 0.001}")"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_data_run_reads_excel_computes_and_leaves_a_png_and_an_offline_chart() {
    let dir = tempfile::tempdir().unwrap();
    let workbook = write_workbook(dir.path());
    let llm = FakeLlm::start(vec![
        Reply::tool("python", json!({"code": ANALYSIS})),
        Reply::tool(
            "terminate",
            json!({"status": "success", "answer": "charts/sales.png and charts/sales.html"}),
        ),
    ])
    .await;
    let out_dir = dir.path().join("out");
    let out = sandboxd(dir.path())
        .env("SANDBOXD_LLM_BASE_URL", llm.base_url())
        .env("SANDBOXD_LLM_MODEL", "fake-model")
        .args(["run", "--no-input", "--agent", "data", "--input"])
        .arg(&workbook)
        .arg("--output")
        .arg(&out_dir)
        .args(["--prompt", "How do ads drive sales? Chart it."])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("copied in: /workspace/sales.xlsx"),
        "{stderr}"
    );

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 2);
    for body in &reqs {
        check_tool_pairing(body).unwrap();
    }
    let observation = last_of_role(&reqs[1], "tool").unwrap();
    let r = pearson(&ADS, &sales());
    assert!(
        observation.contains(&format!("rows=12 r={r:.4} p<0.001=True")),
        "scipy's r is not {r:.4}: {observation}"
    );

    // All three came out: the input, the seaborn PNG and the plotly HTML.
    assert!(out_dir.join("sales.xlsx").is_file());
    let png = std::fs::read(out_dir.join("charts/sales.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let html = std::fs::read_to_string(out_dir.join("charts/sales.html")).unwrap();
    assert!(
        html.len() > 1_000_000 && !html.contains("src=\"https://cdn.plot.ly"),
        "plotly.js is not embedded ({} bytes)",
        html.len()
    );

    // The chart draws in the host's Chromium with the network unreachable.
    let browser = WebBrowser::start_offline().await;
    let page = browser.page().await;
    let url = format!("file://{}", out_dir.join("charts/sales.html").display());
    goto(&page, &url).await;
    wait_for(
        &page,
        "typeof Plotly !== 'undefined' && document.querySelector('svg.main-svg .scatterlayer path.js-line') !== null",
        Duration::from_secs(60),
        "the plotly chart's line",
    )
    .await;
}

const CJK: &str = r#"import json
import warnings
import numpy as np
import matplotlib
import matplotlib.pyplot as plt
from matplotlib.font_manager import findfont, FontProperties
from matplotlib.ft2font import FT2Font
warnings.simplefilter("ignore")
path = findfont(FontProperties(family=matplotlib.rcParams["font.family"]))
def render(text, **kw):
    fig = plt.figure(figsize=(3, 1), dpi=100)
    fig.text(0.05, 0.3, text, fontsize=24, **kw)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba()).copy()
    plt.close(fig)
    return pixels
a, b = render("销售额"), render("趋势图")
ta, tb = render("销售额", family="DejaVu Sans"), render("趋势图", family="DejaVu Sans")
print(json.dumps({
    "backend": matplotlib.get_backend(),
    "font": path,
    "has_glyph": FT2Font(path).get_char_index(ord("销")) != 0,
    "differs_from_tofu": bool((a != ta).any()),
    "glyphs_differ": bool((a != b).any()),
    "tofu_alike": bool((ta == tb).all()),
    "inked": int((a[..., :3] < 128).any(axis=-1).sum()),
}))"#;

#[test]
fn chinese_plot_text_is_drawn_with_the_cjk_font_not_tofu() {
    let dir = tempfile::tempdir().unwrap();
    let out = in_sandbox(dir.path(), CJK);
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        v["backend"].as_str().map(str::to_lowercase).as_deref(),
        Some("agg"),
        "{v}"
    );
    // The font matplotlib resolves by default is the CJK face, and it has the glyph.
    assert!(v["font"].as_str().unwrap().contains("wqy"), "{v}");
    assert_eq!(v["has_glyph"], true, "{v}");
    // Tofu draws every missing character as the same box, so two different strings look
    // alike; the real glyphs differ from each other and from the boxes.
    assert_eq!(v["tofu_alike"], true, "the tofu reference is not tofu: {v}");
    assert_eq!(v["glyphs_differ"], true, "{v}");
    assert_eq!(v["differs_from_tofu"], true, "{v}");
    assert!(v["inked"].as_u64().unwrap() > 100, "nothing drawn: {v}");
}

/// Four plotly charts as self-contained HTML (two Chinese titles, two of codepoints no font
/// has), shot by the image's own Chromium (the host has no CJK font), and their title strips
/// compared. Prints the family a new figure's template resolves to, and what the pixels show.
const PLOTLY_CJK: &str = r#"set -eu
cd /workspace
python3 - <<'PY'
import json
import plotly.graph_objects as go
def page(name, title):
    fig = go.Figure(go.Bar(x=[1, 2, 3], y=[3, 1, 2]))
    fig.update_layout(title_text=title, title_font_size=28, width=600, height=300)
    fig.write_html(name + ".html", include_plotlyjs=True, full_html=True)
for name, title in [("a", "销售额趋势"), ("b", "年度汇总表"),
                    ("ta", "\u0378\u0379\u0380\u0381\u0382"), ("tb", "\u0383\u038b\u038d\u03a2\u0530")]:
    page(name, title)
print(json.dumps({"family": go.Figure().layout.template.layout.font.family}))
PY
for n in a b ta tb; do
    chromium --headless=new --no-sandbox --disable-dev-shm-usage --disable-gpu --hide-scrollbars \
        --no-first-run --user-data-dir="/tmp/chromium-$n" --window-size=600,300 \
        --virtual-time-budget=10000 --screenshot="/workspace/$n.png" "file:///workspace/$n.html" \
        >/dev/null 2>&1
done
python3 - <<'PY'
import json
import matplotlib.image as mpimg
def strip(name):
    # The title's band: plotly puts it in the top margin, above the plot area.
    return (mpimg.imread(name + ".png")[:70, :, :3] * 255).round()
a, b, ta, tb = (strip(n) for n in ("a", "b", "ta", "tb"))
print(json.dumps({
    "differs_from_tofu": bool((a != ta).any()),
    "glyphs_differ": bool((a != b).any()),
    "tofu_alike": bool((ta == tb).all()),
    "inked": int((a < 128).any(axis=-1).sum()),
    "tofu_inked": int((ta < 128).any(axis=-1).sum()),
}))
PY
"#;

#[test]
fn chinese_text_in_a_plotly_chart_names_the_cjk_font_and_is_not_tofu_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let out = sandboxd(dir.path())
        .args(["exec", "--", "bash", "-c", PLOTLY_CJK])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exec failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {stdout}")))
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    // A new figure's default template names the installed CJK face.
    let family = lines[0]["family"].as_str().unwrap_or_default();
    assert!(family.contains("\"WenQuanYi Micro Hei\""), "{stdout}");
    let v = &lines[1];
    // As with matplotlib: tofu draws every missing character as the same box, so the two
    // references look alike; real glyphs differ from each other and from the boxes.
    assert!(v["tofu_inked"].as_u64().unwrap() > 50, "no tofu drawn: {v}");
    assert_eq!(v["tofu_alike"], true, "the tofu reference is not tofu: {v}");
    assert_eq!(v["glyphs_differ"], true, "{v}");
    assert_eq!(v["differs_from_tofu"], true, "{v}");
    assert!(v["inked"].as_u64().unwrap() > 100, "nothing drawn: {v}");
}
