import { useSession } from "../session";

const STATE_TEXT: Record<string, string> = {
  connecting: "connecting…",
  connected: "connected",
  unauthorized: "API key needed",
  unreachable: "server unreachable",
  restarting: "engine restarting",
  error: "error",
};

function gb(v: number | undefined): string {
  return typeof v === "number" ? `${v.toFixed(1)} GB` : "?";
}

export function StatusBar() {
  const { health, model, state, detail, conn, hasHealth } = useSession();
  const sched = health?.scheduler;
  const hw = health?.hwinfo;
  const tiers = health?.tiers;
  const active = typeof sched?.active === "boolean" ? Number(sched.active) : sched?.active;
  return (
    <footer className="statusbar" aria-label="Server status" data-testid="statusbar">
      <span className={`conn conn-${state}`} data-testid="conn-state" data-state={state} title={detail || conn.baseUrl}>
        <span className="dot" aria-hidden="true" /> {STATE_TEXT[state] ?? state}
        {detail && state !== "connected" && <span className="muted"> — {detail}</span>}
      </span>
      {model && (
        <span data-testid="status-model">
          <b>model</b> {model}
        </span>
      )}
      {health?.engine && (
        <span data-testid="status-engine">
          <b>engine</b> {health.arch ?? ""} {health.engine.state ?? health.status}
          {health.engine.restarts ? ` · ${health.engine.restarts} restarts` : ""}
        </span>
      )}
      {hw && (
        <span data-testid="status-hw">
          <b>hardware</b> {hw.cpu || "CPU"} · {hw.cores ?? "?"} cores · RAM {gb(hw.ram_avail_gb)} free of {gb(hw.ram_total_gb)}
          {hw.gpus ? ` · ${hw.gpus} GPU ${hw.gpu ?? ""} ${gb(hw.vram_total_gb)}` : " · no GPU"}
        </span>
      )}
      {sched && (
        <span data-testid="status-scheduler">
          <b>scheduler</b> active {active ?? 0}/{sched.capacity} · queued {sched.queued}
          {typeof sched.max_queue === "number" ? `/${sched.max_queue}` : ""}
          {typeof health?.kv_slots === "number" ? ` · slots ${health.kv_slots}` : ""}
        </span>
      )}
      {tiers && (
        <span data-testid="status-tiers">
          <b>tiers</b> VRAM {tiers.vram} · RAM {tiers.ram} · disk {tiers.disk}
          {tiers.vram_gb || tiers.ram_gb ? ` (${gb(tiers.vram_gb)} / ${gb(tiers.ram_gb)})` : ""}
        </span>
      )}
      {!hasHealth && <span className="muted">this server has no /health: colibri details hidden</span>}
    </footer>
  );
}
