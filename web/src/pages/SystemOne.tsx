import { useEffect, useState } from "react";
import { ApiError, authHeaders, call, errorFromResponse, v1Url } from "../lib/api";
import { fetchExamples } from "../lib/examples";
import { COVERED_AT_LEAST, parseOptions, type SystemOneReply, type SystemOneView, UNSURE_AT, view } from "../lib/systemone";
import { useSession } from "../session";

type Outcome = { kind: "result"; v: SystemOneView; usage: SystemOneReply["usage"] } | { kind: "absent" } | { kind: "error"; message: string };

export function SystemOne() {
  const session = useSession();
  const [doc, setDoc] = useState("");
  const [question, setQuestion] = useState("");
  const [optionsText, setOptionsText] = useState("");
  const [busy, setBusy] = useState(false);
  const [out, setOut] = useState<Outcome | null>(null);
  const [edited, setEdited] = useState(false);

  // Start from the question the served model ships as one it answers well (its examples.json);
  // never over what the user has typed.
  useEffect(() => {
    const ctl = new AbortController();
    void fetchExamples(session.conn, ctl.signal).then((e) => {
      if (ctl.signal.aborted || !e.systemone || edited) return;
      setDoc(e.systemone.state);
      setQuestion(e.systemone.question);
      setOptionsText(e.systemone.options.join("\n"));
    });
    return () => ctl.abort();
  }, [session.conn, edited]);
  const options = parseOptions(optionsText);
  const advertised = session.health?.capabilities?.includes("systemone") ?? session.models.some((m) => m.capabilities?.includes("systemone"));

  const ask = async () => {
    setBusy(true);
    setOut(null);
    try {
      const res = await call(v1Url(session.conn, "/systemone"), {
        method: "POST",
        headers: { ...authHeaders(session.conn), "Content-Type": "application/json" },
        body: JSON.stringify({ model: session.model, state: doc, question, options }),
      });
      if (!res.ok) {
        const err = await errorFromResponse(res);
        // colibri checks `model` before the route, so a missing route can also read model_not_found.
        if (res.status === 404 && (err.code === "not_found" || err.code === "model_not_found" || err.code === null)) {
          setOut({ kind: "absent" });
          return;
        }
        throw err;
      }
      const body = (await res.json()) as SystemOneReply;
      setOut({ kind: "result", v: view(body), usage: body.usage });
    } catch (e) {
      session.reportError(e);
      setOut({ kind: "error", message: e instanceof ApiError ? e.message : String(e) });
    } finally {
      setBusy(false);
    }
  };

  return (
    <section className="systemone" aria-labelledby="s1-title">
      <h1 id="s1-title">System One</h1>
      <p className="muted">
        Closed-set answers: a document, a question and the only answers allowed. The engine reads the probability of each answer and generates
        nothing (<code>POST /v1/systemone</code>).
        {!advertised && " This server does not advertise the systemone capability; asking will tell whether the endpoint exists."}
      </p>
      <form
        className="s1-form"
        onSubmit={(e) => {
          e.preventDefault();
          void ask();
        }}
      >
        <label htmlFor="s1-doc">Document</label>
        <textarea id="s1-doc" rows={5} value={doc} placeholder="A short text the question is about (may be empty)" onChange={(e) => {
            setEdited(true);
            setDoc(e.target.value);
          }} />
        <label htmlFor="s1-q">Question</label>
        <input id="s1-q" value={question} placeholder="Is this review positive or negative?" onChange={(e) => {
            setEdited(true);
            setQuestion(e.target.value);
          }} />
        <label htmlFor="s1-opts">Allowed answers (one per line)</label>
        <textarea id="s1-opts" rows={3} value={optionsText} placeholder={"positive\nnegative"} onChange={(e) => {
            setEdited(true);
            setOptionsText(e.target.value);
          }} />
        <div className="row">
          <button type="submit" className="primary" disabled={busy || options.length < 2 || !question.trim() || !session.model} data-testid="s1-ask">
            {busy ? "Asking…" : "Ask"}
          </button>
          {options.length < 2 && <span className="muted">Give at least two different answers.</span>}
        </div>
      </form>
      {out?.kind === "absent" && (
        <div className="empty-state" data-testid="s1-absent" role="status">
          <h2>Not available on this server</h2>
          <p>
            <code>POST /v1/systemone</code> answered 404 here. This page lights up against a server that implements colibri’s System One endpoint.
          </p>
        </div>
      )}
      {out?.kind === "error" && (
        <p className="error" role="alert" data-testid="s1-error">
          {out.message}
        </p>
      )}
      {out?.kind === "result" && (
        <div className="s1-result" data-testid="s1-result">
          <h2>
            Answer: <span className="answer">{out.v.answer}</span>
          </h2>
          {out.v.covered !== null && (
            <p className={out.v.outOfDepth ? "warning" : "muted"} data-testid="s1-covered" data-out-of-depth={out.v.outOfDepth}>
              {out.v.outOfDepth
                ? `Out of its depth: the allowed answers hold only ${formatShare(out.v.covered)} of the model's probability (under ${COVERED_AT_LEAST * 100} %); it would have answered something else, so the percentages below only rank answers it does not believe.`
                : `The allowed answers hold ${formatShare(out.v.covered)} of the model's probability (the page warns under ${COVERED_AT_LEAST * 100} %).`}
            </p>
          )}
          {out.v.outOfDepth ? null : out.v.unsure ? (
            <p className="warning" data-testid="s1-unsure">
              The model is unsure: the answers are nearly equally likely (normalised entropy {out.v.normalised.toFixed(2)} ≥ {UNSURE_AT}).
            </p>
          ) : (
            <p className="muted">Normalised entropy {out.v.normalised.toFixed(2)}: the model is fairly sure.</p>
          )}
          <table className="bars">
            <thead>
              <tr>
                <th scope="col">answer</th>
                <th scope="col">p</th>
                <th scope="col">logprob</th>
                <th scope="col">tokens</th>
              </tr>
            </thead>
            <tbody>
              {out.v.choices.map((c) => (
                <tr key={c.option}>
                  <th scope="row">{c.option}</th>
                  <td>
                    <span className="bar" style={{ width: `${Math.round(c.p * 100)}%` }} aria-hidden="true" /> {(c.p * 100).toFixed(1)}%
                  </td>
                  <td>{typeof c.logprob === "number" ? c.logprob.toFixed(3) : "—"}</td>
                  <td>{c.tokens ?? "—"}</td>
                </tr>
              ))}
            </tbody>
          </table>
          <p className="muted">
            Entropy {out.v.entropyBits.toFixed(3)} bits over {out.v.choices.length} answers
            {out.v.serverEntropy !== null ? ` · server's entropy ${out.v.serverEntropy.toFixed(3)}` : ""}
            {out.usage?.prompt_tokens !== undefined ? ` · ${out.usage.prompt_tokens} prompt tokens` : ""}
          </p>
        </div>
      )}
    </section>
  );
}

/** A share as a percentage, in scientific notation when it is below 0.01 %. */
function formatShare(x: number): string {
  const pct = x * 100;
  return pct >= 0.01 ? `${pct.toFixed(pct >= 10 ? 1 : 2)} %` : `${pct.toExponential(1)} %`;
}
