import { useState } from "react";
import { ApiError, getJSON, rootUrl } from "../lib/api";
import { aggregate, PHASES, type PhaseKey, type ProfileBody, type ProfileView, WINDOW } from "../lib/profile";
import { usePoll, useSession } from "../session";

export const PROFILE_POLL_MS = 2000;
const NOT_MEASURED = "not measured by this engine";

const PHASE_CLASS: Record<PhaseKey | "other", string> = {
  expert_wait_s: "ph-wait",
  expert_matmul_s: "ph-matmul",
  attention_s: "ph-attn",
  lm_head_s: "ph-head",
  other: "ph-other",
};

function s(v: number): string {
  return v >= 1 ? `${v.toFixed(2)} s` : `${(v * 1000).toFixed(1)} ms`;
}

function PhaseStack({ v }: { v: ProfileView }) {
  const maxWall = Math.max(1e-9, ...v.turns.map((t) => Math.max(t.wall, t.disk)));
  const w = 100 / WINDOW;
  return (
    <svg className="chart" viewBox="0 0 100 60" preserveAspectRatio="none" role="img" aria-label="Per-turn time by phase, last 30 turns" data-testid="phase-chart">
      {v.turns.map((t, i) => {
        let y = 60;
        const segs: { key: PhaseKey | "other"; val: number }[] = [
          ...PHASES.filter((p) => v.measured[p.key]).map((p) => ({ key: p.key, val: t.phases[p.key] })),
          { key: "other", val: t.other },
        ];
        return (
          <g key={t.number}>
            {segs.map((sg) => {
              const h = (sg.val / maxWall) * 60;
              y -= h;
              return <rect key={sg.key} x={i * w + w * 0.1} width={w * 0.8} y={y} height={h} className={PHASE_CLASS[sg.key]} />;
            })}
            {v.diskMeasured && <rect x={i * w + w * 0.1} width={w * 0.8} y={60 - (t.disk / maxWall) * 60} height={0.8} className="ph-disk" />}
            <title>{`turn ${t.number}: ${s(t.wall)} wall`}</title>
          </g>
        );
      })}
    </svg>
  );
}

function Trend({ values, label, testid }: { values: (number | null)[]; label: string; testid: string }) {
  const xs = values.map((x) => x ?? 0);
  const max = Math.max(1e-9, ...xs);
  const pts = xs.map((x, i) => `${(i / Math.max(1, WINDOW - 1)) * 100},${40 - (x / max) * 38}`).join(" ");
  return (
    <svg className="chart trend" viewBox="0 0 100 40" preserveAspectRatio="none" role="img" aria-label={label} data-testid={testid}>
      <polyline points={pts} className="trend-line" vectorEffect="non-scaling-stroke" />
    </svg>
  );
}

export function Profiling() {
  const session = useSession();
  const [state, setState] = useState<{ kind: "loading" } | { kind: "absent" } | { kind: "error"; message: string } | { kind: "ok"; v: ProfileView }>({
    kind: "loading",
  });

  usePoll(
    async (signal) => {
      try {
        const body = await getJSON<ProfileBody>(session.conn, rootUrl(session.conn, "/profile"), signal);
        setState({ kind: "ok", v: aggregate(body) });
      } catch (e) {
        if (e instanceof ApiError && e.kind === "aborted") return;
        if (e instanceof ApiError && e.status === 404) setState({ kind: "absent" });
        else {
          session.reportError(e);
          setState({ kind: "error", message: (e as Error).message });
        }
      }
    },
    PROFILE_POLL_MS,
    session.state !== "unauthorized",
  );

  let body;
  if (state.kind === "loading") body = <p className="muted">Reading /profile…</p>;
  else if (state.kind === "absent")
    body = (
      <div className="empty-state" role="status" data-testid="profile-absent">
        <h2>Not available on this server</h2>
        <p>
          <code>GET /profile</code> answered 404: this server does not publish colibri’s per-turn profile.
        </p>
      </div>
    );
  else if (state.kind === "error")
    body = (
      <p className="error" role="alert">
        {state.message}
      </p>
    );
  else if (state.v.turns.length === 0)
    body = (
      <div className="empty-state" role="status" data-testid="profile-empty">
        <h2>No turns yet</h2>
        <p>Each finished chat turn adds a row here (the engine’s PROF line). Send a message on the Chat page.</p>
      </div>
    );
  else {
    const v = state.v;
    const last = v.turns[v.turns.length - 1]!;
    body = (
      <>
        <div className="cards">
          <div className="card">
            <div className="card-k">turns</div>
            <div className="card-v" data-testid="profile-seq">
              {v.seq}
            </div>
          </div>
          <div className="card">
            <div className="card-k">last turn</div>
            <div className="card-v">{s(last.wall)}</div>
          </div>
          <div className="card">
            <div className="card-k">tok/s (mean, last {v.turns.length})</div>
            <div className="card-v">{v.meanTokensPerSecond?.toFixed(1) ?? "—"}</div>
          </div>
          <div className="card">
            <div className="card-k">tokens per forward</div>
            <div className="card-v">{v.meanTokensPerForward?.toFixed(2) ?? "—"}</div>
          </div>
        </div>
        <h2>Where the last {v.turns.length} turns spent their time</h2>
        <PhaseStack v={v} />
        <ul className="legend" data-testid="phase-legend">
          {PHASES.map((p) => (
            <li key={p.key} data-measured={v.measured[p.key]}>
              <span className={`swatch ${PHASE_CLASS[p.key]}`} aria-hidden="true" /> {p.label}
              {!v.measured[p.key] && <span className="muted"> — {NOT_MEASURED}</span>}
            </li>
          ))}
          <li>
            <span className="swatch ph-other" aria-hidden="true" /> other (wall time no phase accounts for)
          </li>
          <li data-measured={v.diskMeasured}>
            <span className="swatch ph-disk" aria-hidden="true" /> disk service, overlapped with compute
            {!v.diskMeasured && <span className="muted"> — {NOT_MEASURED}</span>}
          </li>
        </ul>
        <div className="two-col">
          <div>
            <h2>Throughput (completion tok/s of each turn)</h2>
            <Trend values={v.turns.map((t) => t.tokensPerSecond)} label="Tokens per second per turn" testid="tps-trend" />
          </div>
          <div>
            <h2>Tokens per forward</h2>
            <Trend values={v.turns.map((t) => t.tokensPerForward)} label="Tokens per forward per turn" testid="tpf-trend" />
          </div>
        </div>
        <h2>Turns</h2>
        <div className="table-scroll" tabIndex={0} role="region" aria-label="Turns table">
          <table className="turns" data-testid="profile-turns">
            <thead>
              <tr>
                <th scope="col">#</th>
                <th scope="col">wall</th>
                <th scope="col">prompt</th>
                <th scope="col">completion</th>
                {PHASES.map((p) => (
                  <th scope="col" key={p.key}>
                    {p.label}
                  </th>
                ))}
                <th scope="col">other</th>
                <th scope="col">disk</th>
                <th scope="col">tok/fwd</th>
              </tr>
            </thead>
            <tbody>
              {[...v.turns].reverse().map((t) => (
                <tr key={t.number} data-turn={t.number}>
                  <th scope="row">{t.number}</th>
                  <td>{s(t.wall)}</td>
                  <td>{t.promptTokens}</td>
                  <td>{t.completionTokens}</td>
                  {PHASES.map((p) => (
                    <td key={p.key} className={v.measured[p.key] ? "" : "muted"} title={v.measured[p.key] ? undefined : NOT_MEASURED}>
                      {v.measured[p.key] ? s(t.phases[p.key]) : "n/m"}
                    </td>
                  ))}
                  <td>{s(t.other)}</td>
                  <td className={v.diskMeasured ? "" : "muted"}>{v.diskMeasured ? s(t.disk) : "n/m"}</td>
                  <td>{t.tokensPerForward?.toFixed(2) ?? "—"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
        <p className="muted">n/m = {NOT_MEASURED} (every turn in the window reports 0 s for it). Updated every {PROFILE_POLL_MS / 1000} s.</p>
      </>
    );
  }
  return (
    <section aria-labelledby="prof-title">
      <h1 id="prof-title">Profiling</h1>
      {body}
    </section>
  );
}
