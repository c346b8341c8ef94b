// A small, safe Markdown renderer for chat replies: fenced code (with light syntax
// highlighting), inline code, headings, bold/italic, links, lists, block quotes, paragraphs.
// Everything is HTML-escaped first, so model output can never inject markup.
"use strict";

const Markdown = (() => {
  const escape = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

  const KEYWORDS = new Set(("def class return if elif else for while in import from as with try except finally " +
    "raise yield lambda pass break continue and or not is None True False function const let var new this " +
    "async await export default switch case fn pub struct impl use mut match int float char void static public " +
    "private package interface type enum").split(" "));

  // One pass over the (unescaped) code: comments, strings, numbers, keywords.
  function highlight(code) {
    const token = /(#[^\n]*|\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)/g;
    let out = "", last = 0, m;
    while ((m = token.exec(code)) !== null) {
      out += escape(code.slice(last, m.index));
      const [text, comment, str, num, word] = m;
      if (comment) out += `<span class="tok-comment">${escape(text)}</span>`;
      else if (str) out += `<span class="tok-string">${escape(text)}</span>`;
      else if (num) out += `<span class="tok-number">${text}</span>`;
      else if (word && KEYWORDS.has(word)) out += `<span class="tok-keyword">${word}</span>`;
      else out += escape(text);
      last = m.index + text.length;
    }
    return out + escape(code.slice(last));
  }

  function inline(text) {
    const codes = [];
    let s = text.replace(/`([^`]+)`/g, (_, c) => { codes.push(c); return `\u0000${codes.length - 1}\u0000`; });
    s = escape(s)
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
      .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener">$1</a>');
    return s.replace(/\u0000(\d+)\u0000/g, (_, i) => `<code>${escape(codes[+i])}</code>`);
  }

  function render(src) {
    const lines = src.replace(/\r\n/g, "\n").split("\n");
    const html = [];
    let para = [], list = null;
    const flushPara = () => { if (para.length) { html.push(`<p>${inline(para.join(" "))}</p>`); para = []; } };
    const flushList = () => { if (list) { html.push(`<${list.tag}>${list.items.map((i) => `<li>${inline(i)}</li>`).join("")}</${list.tag}>`); list = null; } };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^```\s*([\w+-]*)\s*$/);
      if (fence) {
        flushPara(); flushList();
        const body = [];
        for (i++; i < lines.length && !/^```\s*$/.test(lines[i]); i++) body.push(lines[i]);
        const lang = fence[1] ? ` data-lang="${escape(fence[1])}"` : "";
        html.push(`<pre${lang}><code>${highlight(body.join("\n"))}</code></pre>`);
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
      const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
      if (heading) { flushPara(); flushList(); html.push(`<h${heading[1].length}>${inline(heading[2])}</h${heading[1].length}>`); }
      else if (bullet || numbered) {
        flushPara();
        const tag = bullet ? "ul" : "ol";
        if (!list || list.tag !== tag) { flushList(); list = { tag, items: [] }; }
        list.items.push((bullet || numbered)[1]);
      } else if (/^>\s?/.test(line)) { flushPara(); flushList(); html.push(`<blockquote>${inline(line.replace(/^>\s?/, ""))}</blockquote>`); }
      else if (!line.trim()) { flushPara(); flushList(); }
      else { flushList(); para.push(line); }
    }
    flushPara(); flushList();
    return html.join("\n");
  }

  return { render, escape, highlight };
})();
