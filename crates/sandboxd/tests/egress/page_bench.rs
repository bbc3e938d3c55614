//! The egress benchmark's page load, run once against the real engine, image and Chromium:
//! every load, through the proxy and from the sandbox's loopback, fetched all 30
//! sub-resources (the bench checks each), and the table is printed. Timings go to
//! BENCHMARKS.md (`sandboxd bench egress`); none is asserted here.

use sandboxd::bench::egress_page::bench_page_load;

use crate::support as base;

#[tokio::test]
async fn the_page_load_bench_loads_every_sub_resource_both_ways() {
    let m = base::manager().await;
    let (s, _g) = base::session(&m).await;
    let b = bench_page_load(s.sandbox.clone(), 3)
        .await
        .expect("the page-load bench ran");
    assert_eq!(b.proxy.in_page.len(), 3);
    assert_eq!(b.direct.in_page.len(), 3);
    println!(
        "through the proxy: {:?}\nfrom the sandbox's loopback: {:?}",
        b.proxy, b.direct
    );
}
