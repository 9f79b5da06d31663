// sbclaim on Azure Container Apps.
//
// Deploys, into the current resource group, in two passes (see the README,
// "Deploy to Azure Container Apps"):
//
//   pass 1, deployApps=false (the default): a Log Analytics workspace, a
//   Container Apps environment (consumption workload profile), the
//   user-assigned managed identities and their role assignments, and the
//   sqlStatements output that creates their database users. Nothing here
//   needs the database, so it succeeds from an empty resource group; the
//   role assignments then have time to apply (AcrPull before the first
//   image pull) and the database users are created before any replica
//   asks for readiness.
//
//   pass 2, deployApps=true: the same, plus the processor container app
//   and the reconciler job (and, with deployConsole=true, the operator
//   console behind Microsoft Entra sign-in). Re-running either pass is safe (ARM is
//   incremental; pass 1 after pass 2 leaves the apps as they are).
//
// Identities (the README's privileges table is checked against this file
// by deploy_test.go):
//   id-<prefix>-processor   the processor's code: Azure Service Bus Data
//                           Receiver on its queue or subscription only, and
//                           (sqlStatements) the sbclaim_processor role;
//   id-<prefix>-reconciler  the reconciler job's code: the
//                           sbclaim_reconciler database role only;
//   id-<prefix>-console     the operator console's code: the
//                           sbclaim_reconciler database role only (its user
//                           is in sqlStatements when deployConsole is true);
//   id-<prefix>-scaler      the KEDA scale rule only: Azure Service Bus Data
//                           Owner on the watched queue or topic (the scaler
//                           reads message counts, which needs Manage
//                           rights; see modules/servicebus-access.bicep);
//   id-<prefix>-pull        image pulls only: AcrPull on the registry (when
//                           registryName is set).
// Container Apps makes a token of every identity on an app available to
// its code unless identitySettings says otherwise: the scaler and pull
// identities are set to lifecycle 'None' (platform use only: scale rule,
// image pull), so the processor's code can only get its own identity's
// tokens, and the reconciler's only its own.
//
// It uses, and does not create: a Service Bus namespace with the queue (or
// topic and subscription), an Azure SQL logical server and database with a
// Microsoft Entra admin, and (optionally) a container registry holding the
// images built from the repository's Dockerfile (targets processor and
// reconciler). Nothing here sends to Service Bus, so no identity gets the
// Data Sender role.
//
// Running the reconciler as a daemon instead: deploy the reconciler image
// as a second container app with args ['run'], minReplicas = maxReplicas =
// 1, no scale rule and no ingress, SBCLAIM_RECONCILE_SCHEDULE set, a
// liveness probe on port 8081 (GET /healthz: the process serves) and a
// readiness probe there (GET /readyz: the database answers). The job is
// the default because it costs nothing between runs and Container Apps
// records each execution's logs and exit status.

targetScope = 'resourceGroup'

@description('Azure region; defaults to the resource group\'s.')
param location string = resourceGroup().location

@description('Prefix of every resource name. With the default, the identities are id-sbclaim-processor and id-sbclaim-reconciler, the names sql/grants/sqlserver.sql uses.')
@minLength(2)
@maxLength(20)
param namePrefix string = 'sbclaim'

@description('Pass 2: deploy the processor app and the reconciler job. Pass 1 (false) deploys the environment, the identities and their role assignments only, and prints sqlStatements; create the database users and let the role assignments apply before pass 2.')
param deployApps bool = false

// ---- Images ---------------------------------------------------------------

@description('Name of an existing Azure Container Registry holding the images (pulled with the identities, no admin user). Empty when the images are public.')
param registryName string = ''

@description('Resource group of the registry.')
param registryResourceGroup string = resourceGroup().name

@description('Processor image, full reference, e.g. myregistry.azurecr.io/sbclaim/processor:1.0.0 (docker build --target processor).')
param processorImage string

@description('Reconciler image, full reference, e.g. myregistry.azurecr.io/sbclaim/reconciler:1.0.0 (docker build --target reconciler).')
param reconcilerImage string

// ---- Service Bus ------------------------------------------------------------

@description('Name of the existing Service Bus namespace (without .servicebus.windows.net).')
param serviceBusNamespaceName string

@description('Resource group of the Service Bus namespace.')
param serviceBusResourceGroup string = resourceGroup().name

@description('Queue to receive from. Leave empty and set topicName + subscriptionName to receive from a subscription.')
param queueName string = ''

@description('Topic to receive from (with subscriptionName), when queueName is empty.')
param topicName string = ''

@description('Subscription of topicName to receive from.')
param subscriptionName string = ''

@description('Queues the processor publishes follow-up messages to (the outbox; docs/outbox.md): its identity gets Azure Service Bus Data Sender on each, never on the namespace. Enable duplicate detection on them.')
param followUpQueues array = []

@description('Topics the processor publishes follow-up messages to (the outbox): its identity gets Azure Service Bus Data Sender on each.')
param followUpTopics array = []

@description('The entity\'s lock duration, as a Go duration (e.g. 1m). Used by the reconciler to refuse a retention shorter than lock duration × max delivery count.')
param entityLockDuration string = '1m'

@description('The entity\'s MaxDeliveryCount (SBCLAIM_MAX_DELIVERY_COUNT of the processor and the reconciler). The deployment reads the entity\'s own value and fails when this differs: the processor hands a claim to the reconciler before the broker\'s last delivery, counting deliveries by this number, and its identity (Data Receiver) cannot read the entity to check it at start.')
@minValue(1)
@maxValue(2000)
param entityMaxDeliveryCount int = 10

// ---- Claims database (Azure SQL, Entra ID only) ------------------------------

@description('Azure SQL logical server name (without .database.windows.net). Its firewall or network must admit the Container Apps environment.')
param sqlServerName string

@description('Database holding dbo.Claims (run `reconciler migrate` against it first, then sql/grants/sqlserver.sql).')
param sqlDatabaseName string = 'sbclaim'

// ---- Processor ---------------------------------------------------------------

@description('Consumer name recorded in claims (SBCLAIM_CONSUMER); claims are unique per message and consumer. Keep it stable across deployments.')
@maxLength(200)
param consumerName string

@description('Content of the routes file (SBCLAIM_ROUTES), e.g. -p routesYaml="$(cat deploy/routes.yaml)" after copying examples/routes.yaml there and editing it. Mounted at /etc/sbclaim/routes.yaml from a Container Apps secret, in the processor and in the reconciler job. Required for pass 2.')
param routesYaml string = ''

@description('Environment variables the routes file reads with fromEnv (name -> value), e.g. {"PAYMENTS_TOKEN": "Bearer ..."}. Stored as Container Apps secrets.')
@secure()
param routeSecretEnv object = {}

@description('Minimum processor replicas. 1 (default) keeps a receiver warm: no cold start for the first message after a quiet period. 0 lets KEDA scale to zero when the entity is empty (cheapest; the first message then waits for a replica to start), and needs deferral=false: KEDA counts active messages only, so with delayed retries a processor scaled to zero would leave deferred messages unfetched until another message arrives.')
@minValue(0)
param processorMinReplicas int = 1

@description('Delayed retries by deferral (SBCLAIM_DEFERRAL): a request the downstream did not perform is retried later, on the route\'s backoff, by deferring the message. false abandons it instead (redelivered at once, each time spending a delivery). processorMinReplicas=0 requires false (the deployment refuses the combination).')
param deferral bool = true

@description('Maximum processor replicas.')
@minValue(1)
@maxValue(1000)
param processorMaxReplicas int = 10

@description('KEDA target: active messages per replica before another is added.')
param scaleMessageCount int = 5

@description('Messages a replica works on at once (SBCLAIM_MAX_CONCURRENT_CALLS).')
@minValue(1)
param maxConcurrentCalls int = 16

@description('For a session-enabled entity (created with requiresSession): sessions a replica works at once, each one message at a time, in order (SBCLAIM_SESSIONS; see docs/sessions.md). 0 (default): the entity has no sessions. KEDA knows nothing of sessions: bound processorMaxReplicas by the sessions expected to be busy at once divided by this, and raise scaleMessageCount to about this times the messages a busy session has queued.')
@minValue(0)
@maxValue(256)
param sessions int = 0

@description('With sessions: release a session that had no message for this long (SBCLAIM_SESSION_IDLE_TIMEOUT).')
param sessionIdleTimeout string = '1m'

@description('Claim heartbeat interval of the processors (SBCLAIM_HEARTBEAT_INTERVAL); the reconciler\'s staleAfter must be at least 3 times this.')
param heartbeatInterval string = '30s'

@description('A processor takes over a claim whose owner has not heartbeaten for this long (SBCLAIM_TAKEOVER_AFTER).')
param takeoverAfter string = '90s'

// ---- Reconciler job ------------------------------------------------------------

@description('When the reconciler job runs: 5-field cron, UTC.')
param reconcileCron string = '*/5 * * * *'

@description('Flag claims with no heartbeat (or released and not taken over) for this long (SBCLAIM_STALE_AFTER, set on the processor and the reconciler alike); at least 3 × heartbeatInterval.')
param staleAfter string = '5m'

@description('Purge processed claims older than this (SBCLAIM_RETENTION): at least lock duration × max delivery count, plus the message TTL and the time operators may re-submit from the dead-letter queue.')
param retention string = '168h'

@description('Log Analytics retention, days.')
@minValue(30)
param logRetentionDays int = 30

@description('Turn on the environment\'s managed OpenTelemetry agent with Application Insights (workspace-based, on the Log Analytics workspace) as the destination of traces and logs. The agent gives every app the OTEL_EXPORTER_OTLP_* variables, which turn the processor\'s and the reconciler\'s tracing on (README "Tracing"); OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG come from tracesSampler and tracesSamplerArg.')
param openTelemetry bool = false

@description('With openTelemetry: the OpenTelemetry sampler (OTEL_TRACES_SAMPLER), e.g. parentbased_traceidratio; parentbased_always_on keeps every trace.')
param tracesSampler string = 'parentbased_traceidratio'

@description('With openTelemetry: the sampler argument (OTEL_TRACES_SAMPLER_ARG), the fraction of traces kept by a ratio sampler.')
param tracesSamplerArg string = '0.1'

// ---- Operator console (pass 2, with deployConsole) -------------------------------

@description('Deploy the operator console (reconciler console: review, redrive and resolve claims in a browser) as a container app with external ingress and Microsoft Entra sign-in (built-in authentication). Set it in both passes: pass 1 then prints the console identity\'s database user in sqlStatements and its URLs in consoleUrl and consoleRedirectUri.')
param deployConsole bool = false

@description('Application (client) id of the Microsoft Entra app registration operators sign in with. Its web redirect URI must be the consoleRedirectUri output (https://<console FQDN>/.auth/login/aad/callback). Required with deployConsole.')
param consoleClientId string = ''

@description('A client secret of that app registration (stored as a Container Apps secret). Empty: sign-in uses the OpenID Connect implicit flow, which needs "ID tokens" enabled on the app registration.')
@secure()
param consoleClientSecret string = ''

@description('Object ids of the Entra groups whose members may sign in (the token must carry the groups claim: set groupMembershipClaims to SecurityGroup on the app registration). With consoleAllowedPrincipals also empty, anyone who can sign in to the app registration may: then set "Assignment required" on its enterprise application and assign the operators. The console checks the list again on the token it verifies (SBCLAIM_CONSOLE_ALLOWED_GROUPS).')
param consoleAllowedGroups array = []

@description('Object ids of the users (or other principals) who may sign in, in addition to consoleAllowedGroups; checked again by the console (SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS).')
param consoleAllowedPrincipals array = []

@description('Microsoft Entra tenant of the app registration.')
param consoleTenantId string = tenant().tenantId

@description('SAS URL (read, write, delete, list) of a private blob container for the sign-in\'s token store, stored as a Container Apps secret. With the token store on, the platform forwards the signed-in user\'s ID token to the console (X-MS-TOKEN-AAD-ID-TOKEN), which verifies it; without it a browser gets 401 (only Authorization: Bearer clients get in). Required with deployConsole for browser sign-in.')
@secure()
param consoleTokenStoreSasUrl string = ''

// ---- Derived values ------------------------------------------------------------

var useQueue = !empty(queueName)
var useRegistry = !empty(registryName)
var registryServer = useRegistry ? '${registryName}${environment().suffixes.acrLoginServer}' : ''
var processorAppName = '${namePrefix}-processor'
var reconcilerJobName = '${namePrefix}-reconciler'
var consoleAppName = '${namePrefix}-console'
// Known from the environment in pass 1, before the app exists, so the app
// registration's redirect URI can be set before pass 2.
var consoleUrl = 'https://${consoleAppName}.${containerAppsEnv.properties.defaultDomain}'
// The app registration's secret, when given, is a Container Apps secret
// the authentication configuration names.
var consoleAuthSecretName = 'microsoft-provider-authentication-secret'
var consoleAuthSecrets = empty(consoleClientSecret) ? [] : [
  {
    name: consoleAuthSecretName
    value: consoleClientSecret
  }
]
// The token store's blob container, a Container Apps secret the
// authentication configuration names.
var consoleTokenStoreSecretName = 'console-token-store-sas-url'
var consoleTokenStoreSecrets = empty(consoleTokenStoreSasUrl) ? [] : [
  {
    name: consoleTokenStoreSecretName
    value: consoleTokenStoreSasUrl
  }
]
// The issuer whose ID tokens the console verifies: the one the sign-in
// uses (v2.0 endpoint of the tenant); the audience is the app
// registration's client id.
var consoleIssuer = '${environment().authentication.loginEndpoint}${consoleTenantId}/v2.0'
var sqlHost = '${sqlServerName}${environment().suffixes.sqlServerHostname}'

// go-mssqldb with its azuread driver: a token for the user-assigned identity
// named by "user id" (its client id); encrypt=true validates the server
// certificate. No password anywhere.
func databaseUrl(host string, database string, clientId string) string => 'sqlserver://${host}?database=${uriComponent(database)}&encrypt=true&fedauth=ActiveDirectoryManagedIdentity&user+id=${clientId}'

// The database user of an identity and its role membership, each created
// only when missing, so the statements can be run again. The user is named
// by the identity's resource name and bound to its object (principal) id,
// so a name shared with another Entra principal cannot be picked up.
func usersSql(user string, objectId string, role string) string => 'IF DATABASE_PRINCIPAL_ID(N\'${user}\') IS NULL CREATE USER [${user}] FROM EXTERNAL PROVIDER WITH OBJECT_ID = \'${objectId}\';\nIF NOT EXISTS (SELECT 1 FROM sys.database_role_members m JOIN sys.database_principals r ON r.principal_id = m.role_principal_id JOIN sys.database_principals u ON u.principal_id = m.member_principal_id WHERE r.name = N\'${role}\' AND u.name = N\'${user}\') ALTER ROLE ${role} ADD MEMBER [${user}];'

// Delayed retries park messages as deferred, which KEDA's Service Bus
// scaler does not count (active messages only): with deferral on and no
// replica kept, nothing fetches a due deferred message until another
// message arrives, and the reconciler leaves it to its message for
// SBCLAIM_DEFER_GRACE (1 h) past due. Refuse that combination.
var processorMinReplicasChecked = processorMinReplicas < 1 && deferral ? fail('processorMinReplicas=0 with deferral=true: KEDA\'s Service Bus scaler counts active messages only, not deferred ones, so a processor scaled to zero would not fetch delayed retries when they are due. Keep processorMinReplicas at 1 or more, or set deferral=false (retries are then abandoned and redelivered at once).') : processorMinReplicas

// The processor's and the reconciler's SBCLAIM_MAX_DELIVERY_COUNT, checked
// at deployment against the entity's own MaxDeliveryCount (read by
// modules/servicebus-access.bicep with the deployer's rights).
var entityLabel = useQueue ? 'queue ${queueName}' : 'subscription ${topicName}/${subscriptionName}'
var maxDeliveryCount = serviceBusAccess.outputs.maxDeliveryCount == entityMaxDeliveryCount ? entityMaxDeliveryCount : fail('entityMaxDeliveryCount=${entityMaxDeliveryCount} differs from the MaxDeliveryCount of ${entityLabel} (${serviceBusAccess.outputs.maxDeliveryCount}): set entityMaxDeliveryCount to the entity\'s value. The processor hands a claim to the reconciler before the broker\'s last delivery, counting deliveries by it.')

var entityEnv = useQueue ? [
  { name: 'SBCLAIM_QUEUE', value: queueName }
] : [
  { name: 'SBCLAIM_TOPIC', value: topicName }
  { name: 'SBCLAIM_SUBSCRIPTION', value: subscriptionName }
]

var scaleMetadata = useQueue ? {
  namespace: serviceBusNamespaceName
  queueName: queueName
  messageCount: string(scaleMessageCount)
} : {
  namespace: serviceBusNamespaceName
  topicName: topicName
  subscriptionName: subscriptionName
  messageCount: string(scaleMessageCount)
}

// Images are pulled with the pull identity, which the code never sees.
var registries = useRegistry ? [
  {
    server: registryServer
    identity: pullIdentity.id
  }
] : []
var pullIdentities = useRegistry ? { '${pullIdentity.id}': {} } : {}
var pullIdentitySettings = useRegistry ? [
  { identity: pullIdentity.id, lifecycle: 'None' }
] : []

// Container Apps secret names: lowercase letters, digits and '-'.
var routeSecrets = [
  for s in items(routeSecretEnv): {
    name: 'route-${toLower(replace(s.key, '_', '-'))}'
    value: s.value
  }
]
var routeSecretEnvVars = [
  for s in items(routeSecretEnv): {
    name: s.key
    secretRef: 'route-${toLower(replace(s.key, '_', '-'))}'
  }
]
var routesSecrets = concat([
  {
    name: 'routes-yaml'
    value: routesYaml
  }
], routeSecrets)
var routesVolume = {
  name: 'routes'
  storageType: 'Secret'
  secrets: [
    {
      secretRef: 'routes-yaml'
      path: 'routes.yaml'
    }
  ]
}

// Changing a secret does not create a revision, so running replicas would
// keep the old routes: a hash of the routes and route secrets in the
// template makes every change of them a new revision. (A 64-bit hash of
// the values, visible to readers of the app; it does not reveal a
// high-entropy token.)
var configHash = uniqueString(routesYaml, string(routeSecretEnv))

// The OpenTelemetry SDK's own variables, with openTelemetry (the agent sets
// the OTLP endpoint and protocol). Application Insights takes no metrics
// from the agent: the semantic-convention metrics stay off, Prometheus
// serves the rest.
var otelEnv = openTelemetry ? [
  { name: 'OTEL_TRACES_SAMPLER', value: tracesSampler }
  { name: 'OTEL_TRACES_SAMPLER_ARG', value: tracesSamplerArg }
  { name: 'OTEL_METRICS_EXPORTER', value: 'none' }
] : []

// ---- Monitoring and environment ------------------------------------------------

resource logs 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: 'log-${namePrefix}'
  location: location
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: logRetentionDays
  }
}

// Application Insights for the managed OpenTelemetry agent (openTelemetry):
// one message's trace, from the producer through the claim to the
// downstream, and the log lines that carry its trace_id.
resource appInsights 'Microsoft.Insights/components@2020-02-02' = if (openTelemetry) {
  name: 'appi-${namePrefix}'
  location: location
  kind: 'other'
  properties: {
    Application_Type: 'other'
    WorkspaceResourceId: logs.id
  }
}

resource containerAppsEnv 'Microsoft.App/managedEnvironments@2025-07-01' = {
  name: 'cae-${namePrefix}'
  location: location
  properties: {
    // The managed OpenTelemetry agent: apps send OTLP to it (it sets their
    // OTEL_EXPORTER_OTLP_* variables) and it forwards traces and logs to
    // Application Insights, which takes no metrics from it.
    appInsightsConfiguration: openTelemetry ? {
      connectionString: appInsights!.properties.ConnectionString
    } : null
    openTelemetryConfiguration: openTelemetry ? {
      tracesConfiguration: {
        destinations: [ 'appInsights' ]
      }
      logsConfiguration: {
        destinations: [ 'appInsights' ]
      }
    } : null
    appLogsConfiguration: {
      destination: 'log-analytics'
      logAnalyticsConfiguration: {
        customerId: logs.properties.customerId
        sharedKey: logs.listKeys().primarySharedKey
      }
    }
    workloadProfiles: [
      {
        name: 'Consumption'
        workloadProfileType: 'Consumption'
      }
    ]
  }
}

// ---- Identities and roles --------------------------------------------------------

resource processorIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${namePrefix}-processor'
  location: location
}

resource reconcilerIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${namePrefix}-reconciler'
  location: location
}

resource consoleIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${namePrefix}-console'
  location: location
}

resource scalerIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${namePrefix}-scaler'
  location: location
}

resource pullIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${namePrefix}-pull'
  location: location
}

module serviceBusAccess 'modules/servicebus-access.bicep' = {
  name: '${namePrefix}-servicebus-access'
  scope: resourceGroup(serviceBusResourceGroup)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: queueName
    topicName: topicName
    subscriptionName: subscriptionName
    receiverPrincipalId: processorIdentity.properties.principalId
    scalerPrincipalId: scalerIdentity.properties.principalId
    senderQueueNames: followUpQueues
    senderTopicNames: followUpTopics
  }
}

module acrPull 'modules/acr-pull.bicep' = if (useRegistry) {
  name: '${namePrefix}-acr-pull'
  scope: resourceGroup(registryResourceGroup)
  params: {
    registryName: registryName
    principalIds: [
      pullIdentity.properties.principalId
    ]
  }
}

// ---- Processor (pass 2) ------------------------------------------------------------

resource processor 'Microsoft.App/containerApps@2025-07-01' = if (deployApps) {
  name: processorAppName
  location: location
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: union({
      '${processorIdentity.id}': {}
      '${scalerIdentity.id}': {}
    }, pullIdentities)
  }
  properties: {
    environmentId: containerAppsEnv.id
    workloadProfileName: 'Consumption'
    configuration: {
      activeRevisionsMode: 'Single'
      // No ingress: the processor pulls from Service Bus. The platform's
      // probes reach the container port directly.
      registries: registries
      // Only the processor's own identity reaches its code; the scaler's
      // (Data Owner on the entity) serves the scale rule, the pull
      // identity the image pull.
      identitySettings: concat([
        { identity: processorIdentity.id, lifecycle: 'Main' }
        { identity: scalerIdentity.id, lifecycle: 'None' }
      ], pullIdentitySettings)
      secrets: routesSecrets
    }
    template: {
      // Container Apps sends SIGTERM, then SIGKILL after this many seconds.
      // SBCLAIM_TERMINATION_GRACE_PERIOD tells the processor the same
      // number; it checks that SBCLAIM_SHUTDOWN_TIMEOUT (15s, in-flight
      // effects finish), the settle timeout and one store write fit in it.
      terminationGracePeriodSeconds: 30
      containers: [
        {
          name: 'processor'
          image: processorImage
          resources: {
            cpu: json('0.5')
            memory: '1Gi'
          }
          env: concat([
              // DefaultAzureCredential and the SQL driver pick the
              // user-assigned identity by client id; Container Apps does not
              // set AZURE_CLIENT_ID by itself.
              { name: 'AZURE_CLIENT_ID', value: processorIdentity.properties.clientId }
              { name: 'SBCLAIM_SERVICEBUS_NAMESPACE', value: serviceBusAccess.outputs.fullyQualifiedNamespace }
              {
                name: 'SBCLAIM_DATABASE_URL'
                value: databaseUrl(sqlHost, sqlDatabaseName, processorIdentity.properties.clientId)
              }
              { name: 'SBCLAIM_CONSUMER', value: consumerName }
              { name: 'SBCLAIM_ROUTES', value: '/etc/sbclaim/routes.yaml' }
              { name: 'SBCLAIM_MAX_CONCURRENT_CALLS', value: string(maxConcurrentCalls) }
              { name: 'SBCLAIM_SESSIONS', value: string(sessions) }
              { name: 'SBCLAIM_SESSION_IDLE_TIMEOUT', value: sessionIdleTimeout }
              { name: 'SBCLAIM_MAX_LOCK_RENEWAL', value: '5m' }
              { name: 'SBCLAIM_HEARTBEAT_INTERVAL', value: heartbeatInterval }
              { name: 'SBCLAIM_TAKEOVER_AFTER', value: takeoverAfter }
              { name: 'SBCLAIM_STALE_AFTER', value: staleAfter }
              { name: 'SBCLAIM_SHUTDOWN_TIMEOUT', value: '15s' }
              { name: 'SBCLAIM_TERMINATION_GRACE_PERIOD', value: '30s' }
              { name: 'SBCLAIM_DEDUP_KEY', value: 'message-id' }
              { name: 'SBCLAIM_STORE_PAYLOAD', value: 'true' }
              // The entity's MaxDeliveryCount (checked against it above):
              // the processor's identity cannot read it, so it logs at
              // start that it could not check it, and uses this.
              { name: 'SBCLAIM_MAX_DELIVERY_COUNT', value: string(maxDeliveryCount) }
              { name: 'SBCLAIM_DEFERRAL', value: deferral ? 'true' : 'false' }
              { name: 'SBCLAIM_HTTP_ADDR', value: ':8080' }
              { name: 'SBCLAIM_LOG_FORMAT', value: 'json' }
              { name: 'SBCLAIM_LOG_LEVEL', value: 'info' }
              // Not read by the processor: a change of the routes or their
              // secrets changes the template, so a new revision rolls out.
              { name: 'DEPLOY_CONFIG_HASH', value: configHash }
            ], entityEnv, routeSecretEnvVars, otelEnv)
          volumeMounts: [
            {
              volumeName: 'routes'
              mountPath: '/etc/sbclaim'
            }
          ]
          probes: [
            {
              type: 'Liveness'
              httpGet: {
                path: '/healthz'
                port: 8080
              }
              initialDelaySeconds: 5
              periodSeconds: 10
              timeoutSeconds: 3
              failureThreshold: 3
            }
            {
              // Not ready while the claim store refuses writes or Service
              // Bus is unreachable: pass 2 runs after the database users
              // exist, so the first revision can become ready.
              type: 'Readiness'
              httpGet: {
                path: '/readyz'
                port: 8080
              }
              initialDelaySeconds: 2
              periodSeconds: 5
              timeoutSeconds: 3
              failureThreshold: 3
            }
          ]
        }
      ]
      volumes: [
        routesVolume
      ]
      scale: {
        minReplicas: processorMinReplicasChecked
        maxReplicas: processorMaxReplicas
        rules: [
          {
            name: 'servicebus-backlog'
            custom: {
              type: 'azure-servicebus'
              metadata: scaleMetadata
              // The scaler authenticates with its own identity (API
              // 2025-01-01 or later), so no connection string is needed.
              identity: scalerIdentity.id
            }
          }
        ]
      }
    }
  }
  dependsOn: [
    acrPull
  ]
}

// ---- Reconciler (scheduled job, pass 2) -----------------------------------------------

resource reconcilerJob 'Microsoft.App/jobs@2025-07-01' = if (deployApps) {
  name: reconcilerJobName
  location: location
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: union({
      '${reconcilerIdentity.id}': {}
    }, pullIdentities)
  }
  properties: {
    environmentId: containerAppsEnv.id
    workloadProfileName: 'Consumption'
    configuration: {
      triggerType: 'Schedule'
      scheduleTriggerConfig: {
        cronExpression: reconcileCron
        parallelism: 1
        replicaCompletionCount: 1
      }
      // One tick (flag pass + bounded purge) takes seconds; 4 minutes ends a
      // stuck run before the next one starts with the default schedule.
      replicaTimeout: 240
      replicaRetryLimit: 1
      registries: registries
      identitySettings: concat([
        { identity: reconcilerIdentity.id, lifecycle: 'Main' }
      ], pullIdentitySettings)
      // The processor's routes and their secrets: the reconciler recovers
      // claims by running their effects with the same routes. Each
      // execution reads the current secrets, so no hash is needed here.
      secrets: routesSecrets
    }
    template: {
      containers: [
        {
          name: 'reconciler'
          image: reconcilerImage
          // The image's entrypoint is the reconciler binary.
          args: [
            'once'
          ]
          resources: {
            cpu: json('0.25')
            memory: '0.5Gi'
          }
          env: concat([
              { name: 'AZURE_CLIENT_ID', value: reconcilerIdentity.properties.clientId }
              {
                name: 'SBCLAIM_DATABASE_URL'
                value: databaseUrl(sqlHost, sqlDatabaseName, reconcilerIdentity.properties.clientId)
              }
              { name: 'SBCLAIM_ROUTES', value: '/etc/sbclaim/routes.yaml' }
              { name: 'SBCLAIM_STALE_AFTER', value: staleAfter }
              { name: 'SBCLAIM_HEARTBEAT_INTERVAL', value: heartbeatInterval }
              { name: 'SBCLAIM_RETENTION', value: retention }
              { name: 'SBCLAIM_LOCK_DURATION', value: entityLockDuration }
              { name: 'SBCLAIM_MAX_DELIVERY_COUNT', value: string(maxDeliveryCount) }
              { name: 'SBCLAIM_LOG_FORMAT', value: 'json' }
            ], routeSecretEnvVars, otelEnv)
          volumeMounts: [
            {
              volumeName: 'routes'
              mountPath: '/etc/sbclaim'
            }
          ]
        }
      ]
      volumes: [
        routesVolume
      ]
    }
  }
  dependsOn: [
    acrPull
  ]
}

// ---- Operator console (container app behind Entra sign-in, pass 2) ----------------------
//
// reconciler console with external ingress. The platform's built-in
// authentication (authConfigs below) signs every request in with Microsoft
// Entra ID before it reaches the container and redirects unauthenticated
// browsers to the login page; its token store forwards the signed-in
// user's ID token (X-MS-TOKEN-AAD-ID-TOKEN). The console does not take the
// platform's word for it: it verifies that token itself (signature against
// the tenant's published keys, issuer, audience = consoleClientId, expiry:
// SBCLAIM_CONSOLE_OIDC_ISSUER / _AUDIENCE) and refuses every request
// without one (401), so a request that reaches the port without the
// sign-in — the platform's probes, an ingress mistake — with forged
// X-MS-CLIENT-PRINCIPAL-* headers gets nothing. The probes use /healthz on
// port 8081 (SBCLAIM_HTTP_ADDR), apart from the console's 8082.
// SBCLAIM_CONSOLE_LOCAL_OPERATOR and
// SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS are never set here.
// One replica: the oldest-unfinished-age history is kept in the process.
// The routes and their secrets are mounted as in the reconciler job, for
// redrive; the console shows route names only, never the routes file.

resource consoleApp 'Microsoft.App/containerApps@2025-07-01' = if (deployApps && deployConsole) {
  name: consoleAppName
  location: location
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: union({
      '${consoleIdentity.id}': {}
    }, pullIdentities)
  }
  properties: {
    environmentId: containerAppsEnv.id
    workloadProfileName: 'Consumption'
    configuration: {
      activeRevisionsMode: 'Single'
      ingress: {
        external: true
        targetPort: 8082
        transport: 'auto'
        allowInsecure: false
      }
      registries: registries
      identitySettings: concat([
        { identity: consoleIdentity.id, lifecycle: 'Main' }
      ], pullIdentitySettings)
      secrets: concat(routesSecrets, consoleAuthSecrets, consoleTokenStoreSecrets)
    }
    template: {
      // An action in flight (a redrive) gets SBCLAIM_SHUTDOWN_TIMEOUT to
      // finish after SIGTERM.
      terminationGracePeriodSeconds: 30
      containers: [
        {
          name: 'console'
          image: reconcilerImage
          args: [
            'console'
          ]
          resources: {
            cpu: json('0.25')
            memory: '0.5Gi'
          }
          env: concat([
              { name: 'AZURE_CLIENT_ID', value: consoleIdentity.properties.clientId }
              {
                name: 'SBCLAIM_DATABASE_URL'
                value: databaseUrl(sqlHost, sqlDatabaseName, consoleIdentity.properties.clientId)
              }
              { name: 'SBCLAIM_CONSOLE_ADDR', value: ':8082' }
              { name: 'SBCLAIM_HTTP_ADDR', value: ':8081' }
              { name: 'SBCLAIM_CONSOLE_OIDC_ISSUER', value: consoleIssuer }
              { name: 'SBCLAIM_CONSOLE_OIDC_AUDIENCE', value: consoleClientId }
              // The sign-in's allow-list, checked again by the console on
              // the verified token (oid, groups claim).
              { name: 'SBCLAIM_CONSOLE_ALLOWED_GROUPS', value: join(consoleAllowedGroups, ',') }
              { name: 'SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS', value: join(consoleAllowedPrincipals, ',') }
              { name: 'SBCLAIM_ROUTES', value: '/etc/sbclaim/routes.yaml' }
              { name: 'SBCLAIM_HEARTBEAT_INTERVAL', value: heartbeatInterval }
              { name: 'SBCLAIM_SHUTDOWN_TIMEOUT', value: '25s' }
              { name: 'SBCLAIM_LOG_FORMAT', value: 'json' }
              // Not read by the console: a change of the routes or their
              // secrets changes the template, so a new revision rolls out.
              { name: 'DEPLOY_CONFIG_HASH', value: configHash }
            ], routeSecretEnvVars)
          volumeMounts: [
            {
              volumeName: 'routes'
              mountPath: '/etc/sbclaim'
            }
          ]
          probes: [
            {
              // The platform's probes reach the container directly, not
              // through the sign-in: they use the health port, which
              // serves /healthz and /metrics only; the console's port
              // answers 401 without a verified token.
              type: 'Liveness'
              httpGet: {
                path: '/healthz'
                port: 8081
              }
              initialDelaySeconds: 5
              periodSeconds: 15
              timeoutSeconds: 5
              failureThreshold: 3
            }
            {
              type: 'Readiness'
              httpGet: {
                path: '/healthz'
                port: 8081
              }
              initialDelaySeconds: 2
              periodSeconds: 10
              timeoutSeconds: 5
              failureThreshold: 3
            }
          ]
        }
      ]
      volumes: [
        routesVolume
      ]
      scale: {
        minReplicas: 1
        maxReplicas: 1
      }
    }
  }
  dependsOn: [
    acrPull
  ]
}

// Built-in authentication of the console: Microsoft Entra ID, every
// unauthenticated request redirected to its login page, HTTPS only,
// (when given) only the allowed groups and users, and the token store that
// forwards the ID token the console verifies.
resource consoleAuth 'Microsoft.App/containerApps/authConfigs@2025-07-01' = if (deployApps && deployConsole) {
  parent: consoleApp
  name: 'current'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      unauthenticatedClientAction: 'RedirectToLoginPage'
      redirectToProvider: 'azureactivedirectory'
    }
    httpSettings: {
      requireHttps: true
    }
    login: {
      tokenStore: {
        enabled: !empty(consoleTokenStoreSasUrl)
        azureBlobStorage: empty(consoleTokenStoreSasUrl) ? null : {
          sasUrlSettingName: consoleTokenStoreSecretName
        }
      }
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: consoleClientId
          clientSecretSettingName: empty(consoleClientSecret) ? null : consoleAuthSecretName
          openIdIssuer: consoleIssuer
        }
        validation: {
          defaultAuthorizationPolicy: {
            allowedPrincipals: {
              groups: consoleAllowedGroups
              identities: consoleAllowedPrincipals
            }
          }
        }
      }
    }
  }
}

// ---- Outputs (all available after pass 1) ------------------------------------------------

output environmentName string = containerAppsEnv.name
output appInsightsName string = openTelemetry ? appInsights.name : ''
output processorAppName string = processorAppName
output reconcilerJobName string = reconcilerJobName
output processorIdentityName string = processorIdentity.name
output processorIdentityClientId string = processorIdentity.properties.clientId
output processorIdentityPrincipalId string = processorIdentity.properties.principalId
output reconcilerIdentityName string = reconcilerIdentity.name
output reconcilerIdentityClientId string = reconcilerIdentity.properties.clientId
output reconcilerIdentityPrincipalId string = reconcilerIdentity.properties.principalId
output serviceBusNamespace string = serviceBusAccess.outputs.fullyQualifiedNamespace
output consoleAppName string = consoleAppName
output consoleIdentityName string = consoleIdentity.name
output consoleIdentityClientId string = consoleIdentity.properties.clientId
output consoleIdentityPrincipalId string = consoleIdentity.properties.principalId
@description('The operator console\'s address (after pass 2 with deployConsole).')
output consoleUrl string = consoleUrl
@description('The web redirect URI to register on the console\'s Entra app registration (known after pass 1).')
output consoleRedirectUri string = '${consoleUrl}/.auth/login/aad/callback'

@description('T-SQL, run in the database as an Entra principal after sql/grants/sqlserver.sql: one contained user per identity (the console\'s with deployConsole), and its role. Idempotent: every statement checks first, so it can be run again.')
output sqlStatements string = join(concat([
  usersSql(processorIdentity.name, processorIdentity.properties.principalId, 'sbclaim_processor')
  usersSql(reconcilerIdentity.name, reconcilerIdentity.properties.principalId, 'sbclaim_reconciler')
], deployConsole ? [
  usersSql(consoleIdentity.name, consoleIdentity.properties.principalId, 'sbclaim_reconciler')
] : []), '\n')
