//! Tests of the OpenManus import: OpenManus's own example file, every section it documents,
//! the provider special cases, and bad values.

use super::*;

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/openmanus")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn outcome<'a>(report: &'a [ReportLine], key: &str) -> &'a Outcome {
    &report
        .iter()
        .find(|l| l.key == key)
        .unwrap_or_else(|| panic!("{key} is not in the report: {report:#?}"))
        .outcome
}

fn loaded(imported: &Imported) -> Config {
    let table: toml::Table = imported.toml.parse().expect("the output is TOML");
    Config::deserialize(toml::Value::Table(table)).expect("the output loads as sandboxd config")
}

#[test]
fn openmanus_example_file_imports_and_every_key_is_reported() {
    let text = fixture("config.example.toml");
    let imported = import(&text, Some("config/mcp.json")).expect("the example imports");
    let tree: toml::Table = text.parse().unwrap();
    let mut leaves = Vec::new();
    flatten(&mut Vec::new(), &tree, &mut leaves);
    let mut expected: Vec<String> = leaves.iter().map(|(p, _)| p.join(".")).collect();
    let mut reported: Vec<String> = imported.report.iter().map(|l| l.key.clone()).collect();
    expected.sort();
    reported.sort();
    assert_eq!(reported, expected, "one report line per key of the file");
    assert_eq!(expected.len(), 11, "{expected:?}");

    let config = loaded(&imported);
    assert_eq!(config.llm.model, "claude-3-7-sonnet-20250219");
    assert_eq!(config.llm.base_url, "https://api.anthropic.com/v1/");
    assert_eq!(config.llm.max_tokens, 8192);
    assert_eq!(config.mcp.servers_file, "config/mcp.json");
    let vision = config.llm.vision.expect("[llm.vision] carried over");
    assert_eq!(vision.model, "claude-3-7-sonnet-20250219");
    assert!(
        config.llm.api_key.is_empty(),
        "the placeholder key is not a key"
    );
    assert!(
        matches!(outcome(&imported.report, "llm.api_key"), Outcome::Dropped { reason } if reason.contains("OPENAI_API_KEY"))
    );
    assert!(matches!(
        outcome(&imported.report, "mcp.server_reference"),
        Outcome::Dropped { .. }
    ));
}

#[test]
fn every_documented_section_is_mapped_or_dropped_with_a_reason() {
    let text = r#"
        [llm]
        model = "gpt-4o"
        api_key = "sk-real"
        temperature = 0
        max_input_tokens = 50000
        [llm.cheap]
        model = "gpt-4o-mini"
        [agent]
        max_steps = 30
        [browser]
        headless = false
        disable_security = true
        extra_chromium_args = ["--no-sandbox"]
        cdp_url = "ws://x"
        [browser.proxy]
        server = "http://proxy:1"
        password = "p"
        [search]
        engine = "Google"
        fallback_engines = ["DuckDuckGo", "Baidu"]
        retry_delay = 60
        max_retries = 3
        [sandbox]
        use_sandbox = false
        image = "python:3.12-slim"
        work_dir = "/workspace"
        memory_limit = "512m"
        cpu_limit = 2.0
        timeout = 300
        network_enabled = true
        [daytona]
        daytona_api_key = "k"
        [runflow]
        use_data_analysis_agent = true
        [whatever]
        x = 1
    "#;
    let imported = import(text, None).expect("imports");
    let config = loaded(&imported);
    assert_eq!(config.llm.api_key, "sk-real");
    assert_eq!(config.llm.temperature, 0.0);
    assert_eq!(config.agent.max_input_tokens, 50_000);
    assert_eq!(config.agent.max_steps, 30);
    assert_eq!(config.limits.memory_mb, 512);
    assert_eq!(config.limits.cpus, 2.0);
    assert_eq!(config.limits.max_timeout_secs, 300);
    assert_eq!(config.research.retries, 3);
    assert_eq!(config.research.cooldown_secs, 60);
    assert!(config.mcp.servers_file.is_empty());

    let reason = |key: &str| match outcome(&imported.report, key) {
        Outcome::Dropped { reason } => reason.clone(),
        other => panic!("{key} should be dropped, got {other:?}"),
    };
    assert!(reason("sandbox.network_enabled").contains("network device"));
    assert!(reason("browser.proxy.password").contains("egress"));
    assert!(reason("browser.disable_security").contains("never"));
    assert!(reason("daytona.daytona_api_key").contains("Daytona"));
    assert!(reason("llm.cheap.model").contains("[llm.cheap]"));
    assert!(reason("search.engine").contains("searxng"));
    assert!(reason("whatever.x").contains("not a key"));
    assert_eq!(imported.report.len(), 26, "{:#?}", imported.report);
    assert!(
        !imported.toml.contains("proxy") && !imported.toml.contains("password"),
        "nothing dropped reaches the output:\n{}",
        imported.toml
    );
}

#[test]
fn providers_map_to_what_sandboxd_speaks() {
    let azure = r#"[llm]
        api_type = "azure"
        model = "gpt-4o-mini"
        base_url = "https://acme.openai.azure.com/openai/deployments/prod-4o/"
        api_version = "2024-08-01-preview"
        api_key = "az-key""#;
    let config = loaded(&import(azure, None).unwrap());
    assert_eq!(config.llm.api_type, "azure");
    assert_eq!(config.llm.base_url, "https://acme.openai.azure.com");
    assert_eq!(config.llm.deployment, "prod-4o");
    assert_eq!(config.llm.api_version, "2024-08-01-preview");

    let placeholder = r#"[llm]
        api_type = "azure"
        base_url = "{YOUR_AZURE_ENDPOINT.rstrip('/')}/openai/deployments/{AZURE_DEPOLYMENT_ID}""#;
    let imported = import(placeholder, None).unwrap();
    assert!(
        matches!(outcome(&imported.report, "llm.base_url"), Outcome::Dropped { reason } if reason.contains("deployment"))
    );

    let ollama = "[llm]\napi_type = 'ollama'\nbase_url = 'http://localhost:11434/v1'";
    let imported = import(ollama, None).unwrap();
    assert_eq!(loaded(&imported).llm.api_type, "openai");
    assert!(
        matches!(outcome(&imported.report, "llm.api_type"), Outcome::Mapped { note: Some(n), .. } if n.contains("Ollama"))
    );

    let aws = "[llm]\napi_type = 'aws'\nmodel = 'x'";
    let imported = import(aws, None).unwrap();
    assert_eq!(loaded(&imported).llm.api_type, "openai");
    assert!(
        matches!(outcome(&imported.report, "llm.api_type"), Outcome::Dropped { reason } if reason.contains("\"aws\""))
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let e = import("[llm\nmodel=", None).unwrap_err();
    assert!(matches!(e, ImportError::Parse(_)), "{e}");
    let e = import("[sandbox]\nmemory_limit = 'lots'", None).unwrap_err();
    assert!(e.to_string().contains("sandbox.memory_limit"), "{e}");
    let e = import("[sandbox]\ncpu_limit = 'two'", None).unwrap_err();
    assert!(e.to_string().contains("sandbox.cpu_limit"), "{e}");
    // A value of the wrong type for a copied key fails the check of the output, by key name.
    let e = import("[agent]\nmax_steps = 'many'", None).unwrap_err();
    assert!(matches!(e, ImportError::Output(_)), "{e}");
}

#[test]
fn docker_sizes() {
    assert_eq!(docker_size_mb("1g"), Some(1024));
    assert_eq!(docker_size_mb("512m"), Some(512));
    assert_eq!(docker_size_mb("512MB"), Some(512));
    assert_eq!(docker_size_mb("2048k"), Some(2));
    assert_eq!(docker_size_mb("1"), Some(1));
    assert_eq!(docker_size_mb("1t"), None);
    assert_eq!(docker_size_mb("g"), None);
    assert_eq!(docker_size_mb("99999999999999999999g"), None);
}
