/** The page's inline style and live script (docs/page.md §10, §10.3): nothing is loaded from elsewhere. */

/** The route of the page's parts, as JSON `{ parts: { <id>: <html> } }` (docs/page.md §10.3). */
export const PARTS_PATH = "/page.json";

export const STYLE = `
:root{color-scheme:light;--fg:#1b1f24;--mute:#59636e;--line:#d0d7de;--bg:#fff;--soft:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--soft)}
header,main{max-width:1200px;margin:0 auto;padding:0 16px}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:4px 16px;padding-top:12px}
h1{font-size:20px;margin:0}
h2{font-size:17px;margin:0 0 8px}
h3{font-size:15px;margin:12px 0 4px}
section{background:var(--bg);border:1px solid var(--line);border-radius:8px;padding:12px 16px;margin:12px 0;overflow-wrap:break-word}
code,pre,.word,.conditions,.events{overflow-wrap:anywhere}
section:empty{display:none}
a{color:#0550ae}
a:focus-visible,button:focus-visible,select:focus-visible{outline:3px solid #0969da;outline-offset:2px}
#live{margin:0;color:var(--mute);font-size:13px}
#live.lost{color:#a40e26;font-weight:600}
.banner{display:flex;flex-wrap:wrap;align-items:center;gap:4px 20px;margin:-12px -16px;padding:12px 16px;border-radius:8px}
.well{background:#dafbe1;color:#0a3622}.ill{background:#ffebe9;color:#6e0b14}
.verdict{font-size:22px;font-weight:700;margin:0}
.counts{display:flex;flex-wrap:wrap;gap:2px 14px;margin:0;padding:0;list-style:none}
.asof{margin:0 0 0 auto;font-size:13px}
.filters{display:flex;flex-wrap:wrap;gap:8px 12px;align-items:end}
.filters label{display:flex;flex-direction:column;font-size:13px;color:var(--mute)}
select,button{font:inherit;padding:4px 8px;border:1px solid #8c959f;border-radius:6px;background:#fff;min-height:32px}
button{background:#1f6feb;color:#fff;border-color:#1f6feb;cursor:pointer}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:14px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
.word{min-width:14em}
.none{color:var(--mute);margin:4px 0}
.items{margin:0;padding-left:18px}.items li{margin:4px 0}
.conditions{margin:2px 0 6px;padding-left:18px;color:#3d444d}
.tag{display:inline-block;padding:0 6px;border-radius:4px;font-size:12px;font-weight:600;border:1px solid #0002}
.s-applied{background:#dafbe1;color:#0a3622}.s-declares-nothing{background:#eef6ef;color:#2a4a33}
.s-pending{background:#fff4c5;color:#5c4400}.s-never-ran{background:#ddf4ff;color:#0a3069}
.s-failed{background:#ffd8d3;color:#7a0d17}.s-unassigned{background:#eaeef2;color:#424a53}
.nw,.grid td.nw{background:#ffd8d3;color:#7a0d17;box-shadow:inset 0 0 0 2px #cf222e}
.cue{margin:0 0 8px;font-weight:600;color:#7a0d17}.stray{color:#a40e26;font-size:13px}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:0 0 8px;padding:0;list-style:none;font-size:13px;color:var(--mute)}
.grid th,.grid td{border:1px solid var(--line);padding:0;text-align:center}
.grid th[scope=row]{padding:2px 8px;text-align:left;white-space:nowrap}
.grid th .off{display:block;font-weight:600;font-size:12px;color:#a40e26;white-space:normal;max-width:16em}
.grid .mod{vertical-align:bottom;height:9em;padding:4px 2px}
.grid .mod span{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;font-weight:500}
.grid td a{display:block;min-width:3.2em;padding:4px 2px;color:inherit;text-decoration:none;font-weight:600;font-size:13px}
.grid td a:hover{text-decoration:underline}
.grid td.open{outline:3px solid #0969da;outline-offset:-3px}
.grid td.empty{color:#aab}
code{font:13px ui-monospace,SFMono-Regular,Menlo,monospace}
.value{color:var(--mute)}
pre{background:var(--soft);padding:8px;border-radius:6px;white-space:pre-wrap;font-size:13px;margin:0}
.events{margin:0;padding-left:0;list-style:none}.events li{padding:3px 0;border-bottom:1px solid var(--soft)}
.e-failing .tag{background:#ffd8d3;color:#7a0d17}.e-recovered .tag{background:#dafbe1;color:#0a3622}
.e-rotated .tag{background:#ddf4ff;color:#0a3069}.e-refused .tag{background:#eaeef2;color:#424a53}
.bar{position:relative;height:14px;background:#dafbe1;border:1px solid var(--line);border-radius:4px;margin:8px 0;overflow:hidden}
.bar .span{position:absolute;top:0;bottom:0;background:#cf222e}
@media (max-width:600px){body{font-size:14px}section{padding:10px 12px}.banner{margin:-10px -12px;padding:10px 12px}.asof{margin:0}
.list thead{display:none}.list,.list tbody,.list tr,.list td{display:block}.list tr{padding:6px 0;border-bottom:1px solid var(--line)}
.list td{border:0;padding:1px 0}.list td::before{content:attr(data-label)": ";color:var(--mute);font-size:13px}.word{min-width:0}}
`;

/**
 * Polls the page's parts every second (`fetch` of {@link PARTS_PATH} with the page's query, the
 * same origin, so a proxy's `Authorization` goes with it), replaces each part whose HTML changed
 * (keeping the focus on the same link), and says in a text line when it lost the set and when it is back.
 */
export const SCRIPT = `(()=>{const l=document.getElementById("live"),last={};let lost=0;const t=()=>new Date().toISOString().slice(11,19)+" UTC";
async function poll(){try{const r=await fetch("${PARTS_PATH}"+location.search,{cache:"no-store"});if(!r.ok)throw new Error("HTTP "+r.status);const p=(await r.json()).parts;
for(const id in p){const e=document.getElementById(id);if(!e||last[id]===p[id])continue;if(last[id]===undefined&&e.innerHTML===p[id]){last[id]=p[id];continue}
const a=document.activeElement,h=e.contains(a)&&a.getAttribute("href");e.innerHTML=p[id];last[id]=p[id];if(h){const n=e.querySelector('a[href="'+CSS.escape(h)+'"]');if(n)n.focus()}}
l.className="";l.textContent=lost?"Back at "+t()+", after "+Math.round((Date.now()-lost)/1000)+" s away; live":"Live: updated "+t();lost=0}
catch(err){if(!lost)lost=Date.now();l.className="lost";l.textContent="Lost the set at "+new Date(lost).toISOString().slice(11,19)+" UTC ("+err.message+"); trying again every second"}
setTimeout(poll,1000)}setTimeout(poll,1000)})()`;
