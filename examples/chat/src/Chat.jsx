// One useChat chat is one think-jobs agent: the chat id is the agent's name, and the transport
// talks to think-jobs with its defaults (POST {api}, reconnect at {api}/{id}/stream). Only the
// Authorization header is added.
import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport } from "ai";
import { useState } from "react";

function text(message) {
  return message.parts
    .filter((part) => part.type === "text")
    .map((part) => part.text)
    .join("");
}

function Message({ message }) {
  return (
    <li className={`message ${message.role}`} data-role={message.role} data-id={message.id}>
      {text(message)}
    </li>
  );
}

export function Chat({ agentType, agentName, token, initialMessages }) {
  const api = `/api/agents/${encodeURIComponent(agentType)}/chat`;
  const headers = { Authorization: `Bearer ${token}` };
  const [transport] = useState(() => new DefaultChatTransport({ api, headers }));
  const [turnStatus, setTurnStatus] = useState("");
  const [draft, setDraft] = useState("");
  const { messages, sendMessage, regenerate, status, error } = useChat({
    id: agentName,
    messages: initialMessages,
    resume: true,
    transport,
    // think-jobs ends every turn's stream with a transient part carrying the turn's status.
    onData: (part) => {
      if (part.type === "data-think-status") setTurnStatus(part.data.status);
    },
  });
  const busy = status === "submitted" || status === "streaming";
  const send = (event) => {
    event.preventDefault();
    if (!draft.trim()) return;
    setTurnStatus("");
    sendMessage({ text: draft });
    setDraft("");
  };
  // In a resumable chat the SDK's stop() only disconnects: ask think-jobs to stop the turn.
  // Its stream then ends by itself, with the partial reply kept.
  const stop = () =>
    fetch(`${api}/${encodeURIComponent(agentName)}/stop`, { method: "POST", headers });
  const last = messages[messages.length - 1];
  return (
    <section className="chat" data-status={status}>
      <ol className="messages">
        {messages.map((message) => (
          <Message key={message.id} message={message} />
        ))}
      </ol>
      <p className="status">
        <span id="chat-status">{status}</span> <span id="turn-status">{turnStatus}</span>
      </p>
      {error && <p role="alert">{error.message}</p>}
      <form onSubmit={send}>
        <input
          aria-label="Message"
          value={draft}
          onChange={(e) => setDraft(e.target.value)}
          placeholder="Say something"
        />
        <button type="submit">Send</button>
        <button type="button" onClick={stop} disabled={!busy}>
          Stop
        </button>
        <button
          type="button"
          onClick={() => regenerate()}
          disabled={busy || last?.role !== "assistant"}
        >
          Regenerate
        </button>
      </form>
    </section>
  );
}
