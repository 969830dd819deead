//! The admin API of the core (`/_pooler/threads…`), as `pooler thread …` and `pooler retry
//! send-now|opt-out` use it: a thread created with its first message, shown with its turns
//! and queued rows, sent now by a person, opted out, archived; refusals with their codes.

use serde_json::json;

use pooler_tests::core::{CoreSetup, failure, success};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_through_the_admin_api() {
    let h = CoreSetup::new().start().await;
    h.retry_set("delay-ms", "600000").await;
    h.upstream.push(failure(529));

    let (status, created) = h
        .admin(
            "POST",
            "threads",
            json!({"text": "hello", "model": "claude-x"}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let thread = created["thread"]["id"].as_str().unwrap().to_string();
    assert_eq!(created["thread"]["provider"], "claude");
    assert_eq!(created["thread"]["routed_by_pool"], true);
    let first = created["request"].as_str().unwrap().to_string();
    h.settle().await;

    let (status, show) = h
        .admin("GET", &format!("threads/{thread}"), json!({}))
        .await;
    assert_eq!(status, 200, "{show}");
    assert_eq!(show["thread"]["status"], "error");
    assert_eq!(show["turns"][0]["id"], first.as_str());
    assert_eq!(show["turns"][0]["attempt"], 1);
    assert_eq!(show["turns"][0]["outcome"], "failed");
    assert_eq!(show["turns"][0]["failure"]["category"], "overloaded");
    assert_eq!(show["turns"][0]["failure"]["http_status"], 529);
    assert_eq!(show["rows"][0]["attempt"], 2);
    assert_eq!(show["rows"][0]["send_at"], h.now() + 600_000);
    // `tokens` (the thread's token counts) aside, nothing named or holding a token.
    assert!(
        !show
            .to_string()
            .replace("\"tokens\":", "")
            .contains("token"),
        "no route token in the answer: {show}"
    );

    // A person sends the retry now.
    h.upstream.push(success("fine"));
    let (status, sent) = h
        .admin("POST", &format!("threads/{thread}/send-now"), json!({}))
        .await;
    assert_eq!(status, 200, "{sent}");
    assert_eq!(sent["sent"]["attempt"], 2);
    assert_eq!(sent["sent"]["plugin_told"], true);
    h.settle().await;
    let (_, show) = h
        .admin("GET", &format!("threads/{thread}"), json!({}))
        .await;
    assert_eq!(show["turns"][1]["trigger"], "send-now");
    assert_eq!(show["turns"][1]["outcome"], "ok");
    assert_eq!(show["thread"]["status"], "idle");
    let (status, nothing) = h
        .admin("POST", &format!("threads/{thread}/send-now"), json!({}))
        .await;
    assert_eq!(
        (status, &nothing["error"]["code"]),
        (404, &json!("nothing-pending"))
    );

    // Opt-out, a second message, the list, archive.
    let (status, opted) = h
        .admin("PUT", &format!("threads/{thread}/opt-out"), json!({}))
        .await;
    assert_eq!((status, &opted["retry_opt_out"]), (200, &json!(true)));
    assert!(h.core().get_thread(&thread).unwrap().retry_opt_out);
    h.upstream.push(success("again"));
    let (status, _) = h
        .admin(
            "POST",
            &format!("threads/{thread}/messages"),
            json!({"text": "more"}),
        )
        .await;
    assert_eq!(status, 201);
    h.settle().await;
    let (_, list) = h.admin("GET", "threads", json!({})).await;
    assert_eq!(list["threads"][0]["id"], thread.as_str());
    assert_eq!(list["threads"][0]["retry_opt_out"], true);
    let (status, _) = h
        .admin("POST", &format!("threads/{thread}/archive"), json!({}))
        .await;
    assert_eq!(status, 200);
    let (status, refused) = h
        .admin(
            "POST",
            &format!("threads/{thread}/messages"),
            json!({"text": "late"}),
        )
        .await;
    assert_eq!(
        (status, &refused["error"]["code"]),
        (400, &json!("archived"))
    );
    let (status, missing) = h.admin("GET", "threads/th_nope", json!({})).await;
    assert_eq!(
        (status, &missing["error"]["code"]),
        (404, &json!("no-such-thread"))
    );
    assert_eq!(h.upstream_turns(), 3);
}
