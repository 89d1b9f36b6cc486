// One useChat chat is one think-jobs agent: the chat id is the agent's name, and the transport
// talks to think-jobs with its defaults (POST {api}, reconnect at {api}/{id}/stream). Only the
// Authorization header is added. A tool call that needs approval shows Approve and Deny: the
// SDK's own addToolApprovalResponse, then sendAutomaticallyWhen POSTs the answer to the chat.
import { useChat } from "@ai-sdk/react";
import {
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";
import { useState } from "react";

function text(message) {
  return message.parts
    .filter((part) => part.type === "text")
    .map((part) => part.text)
    .join("");
}

function ToolCall({ part, onAnswer }) {
  const waiting = part.state === "approval-requested";
  return (
    <div className="tool" data-tool={part.type} data-tool-state={part.state}>
      {part.type.slice("tool-".length)} {JSON.stringify(part.input)}: {part.state}
      {waiting && (
        <>
          <button type="button" onClick={() => onAnswer(part.approval.id, true)}>
            Approve
          </button>
          <button type="button" onClick={() => onAnswer(part.approval.id, false)}>
            Deny
          </button>
        </>
      )}
    </div>
  );
}

function Message({ message, onAnswer }) {
  const tools = message.parts.filter((part) => part.type.startsWith("tool-"));
  return (
    <li className={`message ${message.role}`} data-role={message.role} data-id={message.id}>
      {tools.length === 0 ? (
        text(message)
      ) : (
        <>
          <span className="text">{text(message)}</span>
          {tools.map((part) => (
            <ToolCall key={part.toolCallId} part={part} onAnswer={onAnswer} />
          ))}
        </>
      )}
    </li>
  );
}

export function Chat({ agentType, agentName, token, initialMessages }) {
  const api = `/api/agents/${encodeURIComponent(agentType)}/chat`;
  const headers = { Authorization: `Bearer ${token}` };
  const [transport] = useState(
    () =>
      new DefaultChatTransport({
        api,
        headers,
        // The conversation lives on the server: send the newest message only, so a long chat
        // never meets the request size limit (the server reads nothing else of the history).
        prepareSendMessagesRequest: ({ id, messages, trigger, messageId, body }) => ({
          body: { ...body, id, trigger, messageId, messages: messages.slice(-1) },
        }),
      }),
  );
  const [turnStatus, setTurnStatus] = useState("");
  const [draft, setDraft] = useState("");
  const { messages, sendMessage, regenerate, status, error, addToolApprovalResponse } = useChat({
    id: agentName,
    messages: initialMessages,
    resume: true,
    transport,
    // Once every approval of the last reply is answered, POST it: think-jobs runs the tool
    // (or tells the model it was denied) and streams the rest of that reply.
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
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
  const answer = (id, approved) => {
    setTurnStatus("");
    addToolApprovalResponse({ id, approved, reason: approved ? undefined : "denied in the chat" });
  };
  return (
    <section className="chat" data-status={status}>
      <ol className="messages">
        {messages.map((message) => (
          <Message key={message.id} message={message} onAnswer={answer} />
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
