"""``oodeval construct``: build an OOD benchmark from label errors (candidates, evidence, protocol, export)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..construct.candidates import check_not_initialised, flag_counts, load_project, pin_project, write_project
from ..construct.evidence import build_evidence, check_templates, load_embeddings, load_text_embeddings
from ..construct.export import export
from ..construct.protocol import ProtocolStore, open_store
from ..errors import InputError
from ..llm import ChatClient
from ._options import add_command

TOKEN_ENV = "OODEVAL_TOKEN"
HELP = "build an OOD benchmark from label errors: candidates, evidence, annotation app, export"
EXAMPLES = [
    "oodeval construct candidates work/ --manifest imagenet-val.csv --reannotation reimagenet.csv",
    "oodeval construct serve work/",
    "oodeval construct export work/ --out benchmark/",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="construct_command", metavar="STEP", required=True)

    c = add_command(sub, "candidates", "select the images the reannotation assigned to no class; print counts by flag",
                    "oodeval construct candidates work/ --manifest imagenet-val.csv --reannotation reimagenet.csv --classes classes.txt")
    c.add_argument("work", type=Path, help="work folder to create or update")
    c.add_argument("--manifest", type=Path, required=True, help="ID manifest CSV (path,label[,url,...])")
    c.add_argument("--reannotation", type=Path, required=True, help="reannotation CSV (path,reannotated,flag[,original_label])")
    c.add_argument("--classes", type=Path, help="ID class names (.txt one per line, or .csv label,name)")
    c.add_argument("--root", type=Path, help="folder the manifest paths are relative to (default: the manifest's folder)")
    c.set_defaults(_step=_candidates)

    e = add_command(sub, "evidence", "build the per-image evidence JSON (C, D, E, and A/B when configured)",
                    "oodeval construct evidence work/ --image-embeddings feats/val --text-embeddings text.npy")
    e.add_argument("work", type=Path, help="work folder (from `oodeval construct init`)")
    e.add_argument("--image-embeddings", type=Path, help="(D) image embeddings aligned with the ID manifest: .npy or FeatureSet folder")
    e.add_argument("--text-embeddings", type=Path, help="(D) class text embeddings: (C, E) .npy, FeatureSet folder, or label-keyed .npz / text-cache folder")
    e.add_argument("--top-k", type=int, default=5, help="(D) closest ID classes to list (default 5)")
    e.add_argument("--confusions-k", type=int, default=5, help="(E) confusable classes to list (default 5)")
    e.add_argument("--llm-base-url", help="(A) OpenAI-compatible endpoint, e.g. https://api.openai.com/v1")
    e.add_argument("--llm-model", help="(A) multimodal model name")
    e.add_argument("--llm-key-env", default="OPENAI_API_KEY", help="(A) environment variable with the API key")
    e.add_argument("--llm-cache", type=Path, help="(A) response cache folder (default WORK/llm-cache)")
    e.add_argument("--llm-offline", action="store_true", help="(A) answer only from the cache")
    e.add_argument("--image-url-template", help="(B) public image URL, e.g. 'https://host/val/{path}' (a manifest 'url' column wins)")
    e.add_argument("--search-template", action="append", default=[], metavar="NAME=URL",
                   help="(B) reverse-search service, URL with {url}; repeat; default Google Lens, Bing, Yandex, TinEye")
    e.add_argument("--force", action="store_true", help="rebuild every piece instead of completing missing ones")
    e.set_defaults(_step=_evidence)

    i = add_command(sub, "init", "create the protocol store and print one access token per annotator",
                    "oodeval construct init work/ --stage1 alice bob --stage3 carol")
    i.add_argument("work", type=Path, help="work folder (from `oodeval construct init`)")
    i.add_argument("--stage1", nargs=2, required=True, metavar="NAME", help="the two Stage-1 annotators")
    i.add_argument("--stage3", required=True, metavar="NAME", help="the third annotator who joins in Stage 3")
    i.set_defaults(_step=_init)

    s = add_command(sub, "serve", "run the annotation web app",
                    "oodeval construct serve work/ --port 8765")
    s.add_argument("work", type=Path, help="work folder (from `oodeval construct init`)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1, this machine only)")
    s.add_argument("--port", type=int, default=8765, help="TCP port of the annotation app (default 8765)")
    s.add_argument("--examples", type=int, default=4, help="example images per candidate ID class (default 4)")
    s.set_defaults(_step=_serve)

    v = add_command(sub, "verdict", "submit one verdict from the command line (scripting)",
                    "oodeval construct verdict work/ --token-file alice.token val/n01440764/x.JPEG ood --label 'tiger shark'",
                    allow_abbrev=False)
    v.add_argument("work", type=Path, help="work folder (from `oodeval construct init`)")
    v.add_argument("--token-file", type=Path, help=f"file holding the annotator's access token (default: the {TOKEN_ENV} environment variable)")
    v.add_argument("--stage", type=int, choices=(1, 3), default=1, help="annotation stage the verdict belongs to (default 1)")
    v.add_argument("image", help="image id (its manifest path)")
    v.add_argument("verdict", choices=("ood", "id", "ambiguous"), help="the verdict on the image")
    v.add_argument("--label", help="proposed OOD label (ood)")
    v.add_argument("--sense", metavar="WNID", help="the WordNet noun sense the label means, e.g. n02451415 (ood; default: a free label "
                   "that matches only the same label)")
    v.add_argument("--fine-grained", action="store_true", help="OOD object is a close sibling of its original class")
    v.add_argument("--id-class", type=int, help="ID class index (id)")
    v.add_argument("--note", help="free-text note stored with the verdict (default none)")
    v.set_defaults(_step=_verdict)

    t = add_command(sub, "token", "access tokens: `token reissue WORK NAME` replaces a lost or leaked one",
                    "oodeval construct token reissue work/ alice")
    t.add_argument("action", choices=("reissue",), help="reissue: a new token for NAME, the old one stops working")
    t.add_argument("work", type=Path, help="work folder (from `oodeval construct init`)")
    t.add_argument("name", help="the annotator whose token is replaced (the old one stops working)")
    t.set_defaults(_step=_token)

    r = add_command(sub, "reopen", "coordinator: reopen a decided image (its verdicts stop counting; it starts again in Stage 1)",
                    "oodeval construct reopen work/ val/n01440764/x.JPEG --reason 'alice mistyped the label'")
    r.add_argument("work", type=Path, help="work folder (from `oodeval construct init`)")
    r.add_argument("image", help="image id (its manifest path)")
    r.add_argument("--reason", required=True, help="why (logged in the store with your user name)")
    r.add_argument("--yes", action="store_true", help="confirm without the interactive question")
    r.set_defaults(_step=_reopen)

    st = add_command(sub, "status", "images per state and progress per annotator", "oodeval construct status work/")
    st.add_argument("work", type=Path, help="work folder (from `oodeval construct init`)")
    st.set_defaults(_step=_status)

    x = add_command(sub, "export", "write the OOD manifest, returned-to-ID and ambiguous lists and the outcome table",
                    "oodeval construct export work/ --out benchmark/")
    x.add_argument("work", type=Path, help="work folder (from `oodeval construct init`)")
    x.add_argument("--out", type=Path, help="export folder (default WORK/export)")
    x.add_argument("--allow-pending", action="store_true", help="export although some images are undecided")
    x.set_defaults(_step=_export)


def _print_flags(counts: dict[str, int]) -> None:
    total = sum(counts.values())
    print(f"{total} candidate images (assigned to no class by the reannotation)")
    for flag, n in counts.items():
        print(f"  {flag:<24} {n:6d}  ({100 * n / total:.1f}%)")


def _candidates(args: argparse.Namespace) -> int:
    project = write_project(args.work, args.manifest, args.reannotation, args.classes, args.root)
    _print_flags(flag_counts(project.candidates))
    print(f"wrote {args.work / 'candidates.csv'}")
    return 0


def _evidence(args: argparse.Namespace) -> int:
    templates = {}
    for item in args.search_template:
        name, sep, url = item.partition("=")
        if not sep or not name:
            raise InputError(f"--search-template wants NAME=URL, got {item!r}")
        templates[name] = url
    check_templates(args.image_url_template, templates)
    check_not_initialised(args.work, "evidence")
    project = load_project(args.work)
    img = load_embeddings(args.image_embeddings) if args.image_embeddings else None
    txt = load_text_embeddings(args.text_embeddings, project.class_names) if args.text_embeddings else None
    client = None
    if args.llm_base_url or args.llm_model:
        if not (args.llm_base_url and args.llm_model):
            raise InputError("evidence (A) needs both --llm-base-url and --llm-model")

        client = ChatClient(args.llm_base_url, args.llm_model, api_key_env=args.llm_key_env,
                            cache_dir=args.llm_cache or args.work / "llm-cache", offline=args.llm_offline)
    done = build_evidence(project, img, txt, args.top_k, args.confusions_k, client, args.image_url_template, args.force,
                          search_templates=templates or None)
    n = len(project.candidates)
    print(f"evidence for {n} images in {project.evidence_dir} ({done['written']} files written)")
    for key, label in (("original", "(C) original label"), ("vlm_topk", "(D) VLM top-k"), ("confusions", "(E) confusable classes"),
                       ("mllm", "(A) MLLM answer"), ("reverse_search", "(B) reverse search links")):
        print(f"  {label:<26} {done[key]:6d} / {n}")
    return 0


def _init(args: argparse.Namespace) -> int:
    project = load_project(args.work)
    try:
        _, tokens = ProtocolStore.create(project.db_path, project.candidates, args.stage1, args.stage3, project.n_classes,
                                         class_names=project.class_names)
    except FileExistsError as exc:
        raise InputError(str(exc)) from None
    pin_project(project)
    print(f"protocol store {project.db_path}: {len(project.candidates)} images")
    print("access tokens (shown once; give each annotator only their own):")
    for name, token in tokens.items():
        role = "stage 3" if name == args.stage3 else "stage 1"
        print(f"  {name}\t{role}\t{token}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from ..construct.app import bind_warning, make_server

    warning = bind_warning(args.host)
    if warning:
        print(f"oodeval construct serve: warning: {warning}", file=sys.stderr)
    server = make_server(args.work, args.host, args.port, examples=args.examples)
    host, port = server.server_address[:2]
    host = f"[{host}]" if ":" in host else host
    print(f"annotation app on http://{host}:{port}/  (open it and log in with your access token)")
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def _verdict(args: argparse.Namespace) -> int:
    store = open_store(load_project(args.work))
    who = store.authenticate(_read_token(args.token_file))
    row = store.submit(who.name, args.image, args.stage, args.verdict, args.label, args.fine_grained, args.id_class, args.note,
                       ood_sense=args.sense)
    o = store.outcome(args.image)
    state = f"{o.verdict} (stage {o.stage})" if o.status == "final" else f"pending in {o.status}"
    print(f"row {row}: {who.name} stage {args.stage} {args.verdict} on {args.image}; image now {state}")
    return 0


def _read_token(token_file: Path | None) -> str:
    """The access token from ``--token-file`` or the environment; never from argv (``ps`` would show it)."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise InputError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
        if not token:
            raise InputError(f"--token-file {token_file} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise InputError(f"no access token: set {TOKEN_ENV} or pass --token-file FILE")
    return token


def _token(args: argparse.Namespace) -> int:
    token = open_store(load_project(args.work)).reissue(args.name)
    print(f"new access token for {args.name} (shown once; the old one no longer works):")
    print(f"  {args.name}\t{token}")
    return 0


def _reopen(args: argparse.Namespace) -> int:
    import getpass


    store = open_store(load_project(args.work))
    o = store.outcome(args.image)
    if o.status != "final":
        raise InputError(f"image {args.image!r} is not decided (it is in {o.status}); there is nothing to reopen")
    what = f"{o.verdict}{' ' + repr(o.ood_label) if o.ood_label else ''} (decided at Stage {o.stage})"
    if not args.yes:
        if not sys.stdin.isatty():
            raise InputError("reopening a decided image needs confirmation: run it in a terminal or pass --yes")
        answer = input(f"Reopen {args.image}, now {what}? Its verdicts stop counting and both Stage-1 annotators judge it again. "
                       "Type 'reopen' to confirm: ")
        if answer.strip() != "reopen":
            print("not reopened")
            return 1
    done = store.reopen(args.image, args.reason, getpass.getuser())
    print(f"reopened {args.image} (was {what}); it is back in Stage 1 (logged as reopening {done['reopening']})")
    if done["stale_export"]:
        print(f"oodeval construct reopen: warning: the export in {done['stale_export']} (made {done['export_created']}) includes "
              "this image's decision and is now stale; run `oodeval construct export` again once it is decided", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    store = open_store(load_project(args.work))
    summary = store.summary()
    print("images: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    for p in store.progress():
        s1 = f"stage 1 {p['stage1_done']}/{p['stage1_total']}" if p["role"] == "stage1" else "stage 1 -"
        print(f"  {p['annotator']:<16} {s1:<20} stage 3 {p['stage3_done']}/{p['stage3_total']}")
    stale = store.stale_export()
    if stale:
        print(f"the export in {stale['folder']} (made {stale['created']}) is stale: {len(stale['reopened'])} image(s) it included "
              "were reopened since; run `oodeval construct export` again")
    return 0


def _export(args: argparse.Namespace) -> int:
    project = load_project(args.work)
    paths = export(project, open_store(project, check_evidence=True), args.out, args.allow_pending)
    print(paths["outcome_md"].read_text(), end="")
    for key, path in paths.items():
        print(f"wrote {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    return int(args._step(args) or 0)
