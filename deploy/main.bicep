// sbclaim on Azure Container Apps.
//
// Deploys, into the current resource group:
//   - a Log Analytics workspace and a Container Apps environment
//     (consumption workload profile);
//   - three user-assigned managed identities:
//       id-<prefix>-processor   the processor's code: Service Bus Data
//                               Receiver on the namespace, AcrPull, and (by
//                               you, with sql/grants/sqlserver.sql) the
//                               sbclaim_processor role in the database;
//       id-<prefix>-reconciler  the reconciler job: AcrPull and the
//                               sbclaim_reconciler database role;
//       id-<prefix>-scaler      only the KEDA scale rule: Service Bus Data
//                               Owner on the watched queue/topic (the scaler
//                               reads message counts, which needs Manage
//                               rights; see modules/servicebus-access.bicep);
//   - the processor container app with a KEDA azure-servicebus scale rule;
//   - the reconciler as a scheduled Container Apps job (`reconciler once`).
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
// 1, no scale rule and no ingress, SBCLAIM_RECONCILE_SCHEDULE set, and a
// liveness probe on port 8081 (GET /healthz pings the database). The job is
// the default because it costs nothing between runs and Container Apps
// records each execution's logs and exit status.

targetScope = 'resourceGroup'

@description('Azure region; defaults to the resource group\'s.')
param location string = resourceGroup().location

@description('Prefix of every resource name. With the default, the identities are id-sbclaim-processor and id-sbclaim-reconciler, the names sql/grants/sqlserver.sql uses.')
@minLength(2)
@maxLength(20)
param namePrefix string = 'sbclaim'

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

@description('The entity\'s lock duration, as a Go duration (e.g. 1m). Used by the reconciler to refuse a retention shorter than lock duration × max delivery count.')
param entityLockDuration string = '1m'

@description('The entity\'s max delivery count.')
@minValue(1)
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

@description('Content of the routes file (SBCLAIM_ROUTES), e.g. --parameters routesYaml="$(cat routes.yaml)". Mounted at /etc/sbclaim/routes.yaml from a Container Apps secret.')
param routesYaml string

@description('Environment variables the routes file reads with fromEnv (name -> value), e.g. {"PAYMENTS_TOKEN": "Bearer ..."}. Stored as Container Apps secrets.')
@secure()
param routeSecretEnv object = {}

@description('Minimum processor replicas. 1 (default) keeps a receiver warm: no cold start for the first message after a quiet period. 0 lets KEDA scale to zero when the entity is empty (cheapest; the first message then waits for a replica to start).')
@minValue(0)
param processorMinReplicas int = 1

@description('Maximum processor replicas.')
@minValue(1)
@maxValue(1000)
param processorMaxReplicas int = 10

@description('KEDA target: active messages per replica before another is added.')
param scaleMessageCount int = 5

@description('Messages a replica works on at once (SBCLAIM_MAX_CONCURRENT_CALLS).')
@minValue(1)
param maxConcurrentCalls int = 16

@description('Claim heartbeat interval of the processors (SBCLAIM_HEARTBEAT_INTERVAL); the reconciler\'s staleAfter must be at least 3 times this.')
param heartbeatInterval string = '30s'

// ---- Reconciler job ------------------------------------------------------------

@description('When the reconciler job runs: 5-field cron, UTC.')
param reconcileCron string = '*/5 * * * *'

@description('Flag claims with no heartbeat (or released and not taken over) for this long (SBCLAIM_STALE_AFTER); at least 3 × heartbeatInterval.')
param staleAfter string = '5m'

@description('Purge processed claims older than this (SBCLAIM_RETENTION): at least lock duration × max delivery count, plus the message TTL and the time operators may re-submit from the dead-letter queue.')
param retention string = '168h'

@description('Log Analytics retention, days.')
@minValue(30)
param logRetentionDays int = 30

// ---- Derived values ------------------------------------------------------------

var useQueue = !empty(queueName)
var registryServer = empty(registryName) ? '' : '${registryName}${environment().suffixes.acrLoginServer}'
var sqlHost = '${sqlServerName}${environment().suffixes.sqlServerHostname}'

// go-mssqldb with its azuread driver: a token for the user-assigned identity
// named by "user id" (its client id); encrypt=true validates the server
// certificate. No password anywhere.
func databaseUrl(host string, database string, clientId string) string => 'sqlserver://${host}?database=${uriComponent(database)}&encrypt=true&fedauth=ActiveDirectoryManagedIdentity&user+id=${clientId}'

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

var processorRegistries = empty(registryName) ? [] : [
  {
    server: registryServer
    identity: processorIdentity.id
  }
]
var reconcilerRegistries = empty(registryName) ? [] : [
  {
    server: registryServer
    identity: reconcilerIdentity.id
  }
]

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

resource containerAppsEnv 'Microsoft.App/managedEnvironments@2025-07-01' = {
  name: 'cae-${namePrefix}'
  location: location
  properties: {
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

resource scalerIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'id-${namePrefix}-scaler'
  location: location
}

module serviceBusAccess 'modules/servicebus-access.bicep' = {
  name: '${namePrefix}-servicebus-access'
  scope: resourceGroup(serviceBusResourceGroup)
  params: {
    namespaceName: serviceBusNamespaceName
    queueName: queueName
    topicName: topicName
    receiverPrincipalId: processorIdentity.properties.principalId
    scalerPrincipalId: scalerIdentity.properties.principalId
  }
}

module acrPull 'modules/acr-pull.bicep' = if (!empty(registryName)) {
  name: '${namePrefix}-acr-pull'
  scope: resourceGroup(registryResourceGroup)
  params: {
    registryName: registryName
    principalIds: [
      processorIdentity.properties.principalId
      reconcilerIdentity.properties.principalId
    ]
  }
}

// ---- Processor -------------------------------------------------------------------

resource processor 'Microsoft.App/containerApps@2025-07-01' = {
  name: '${namePrefix}-processor'
  location: location
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${processorIdentity.id}': {}
      '${scalerIdentity.id}': {}
    }
  }
  properties: {
    environmentId: containerAppsEnv.id
    workloadProfileName: 'Consumption'
    configuration: {
      activeRevisionsMode: 'Single'
      // No ingress: the processor pulls from Service Bus. The platform's
      // probes reach the container port directly.
      registries: processorRegistries
      secrets: concat([
        {
          name: 'routes-yaml'
          value: routesYaml
        }
      ], routeSecrets)
    }
    template: {
      // Container Apps sends SIGTERM, then SIGKILL after this many seconds.
      // SBCLAIM_SHUTDOWN_TIMEOUT (25s) lets in-flight effects finish and
      // leaves 5 s to settle messages and close connections.
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
              { name: 'SBCLAIM_MAX_LOCK_RENEWAL', value: '5m' }
              { name: 'SBCLAIM_HEARTBEAT_INTERVAL', value: heartbeatInterval }
              { name: 'SBCLAIM_SHUTDOWN_TIMEOUT', value: '25s' }
              { name: 'SBCLAIM_DEDUP_KEY', value: 'message-id' }
              { name: 'SBCLAIM_STORE_PAYLOAD', value: 'true' }
              { name: 'SBCLAIM_HTTP_ADDR', value: ':8080' }
              { name: 'SBCLAIM_LOG_FORMAT', value: 'json' }
              { name: 'SBCLAIM_LOG_LEVEL', value: 'info' }
            ], entityEnv, routeSecretEnvVars)
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
        {
          name: 'routes'
          storageType: 'Secret'
          secrets: [
            {
              secretRef: 'routes-yaml'
              path: 'routes.yaml'
            }
          ]
        }
      ]
      scale: {
        minReplicas: processorMinReplicas
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

// ---- Reconciler (scheduled job) ----------------------------------------------------

resource reconcilerJob 'Microsoft.App/jobs@2025-07-01' = {
  name: '${namePrefix}-reconciler'
  location: location
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${reconcilerIdentity.id}': {}
    }
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
      registries: reconcilerRegistries
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
          env: [
            { name: 'AZURE_CLIENT_ID', value: reconcilerIdentity.properties.clientId }
            {
              name: 'SBCLAIM_DATABASE_URL'
              value: databaseUrl(sqlHost, sqlDatabaseName, reconcilerIdentity.properties.clientId)
            }
            { name: 'SBCLAIM_STALE_AFTER', value: staleAfter }
            { name: 'SBCLAIM_HEARTBEAT_INTERVAL', value: heartbeatInterval }
            { name: 'SBCLAIM_RETENTION', value: retention }
            { name: 'SBCLAIM_LOCK_DURATION', value: entityLockDuration }
            { name: 'SBCLAIM_MAX_DELIVERY_COUNT', value: string(entityMaxDeliveryCount) }
            { name: 'SBCLAIM_LOG_FORMAT', value: 'json' }
          ]
        }
      ]
    }
  }
  dependsOn: [
    acrPull
  ]
}

// ---- Outputs ----------------------------------------------------------------------

output environmentName string = containerAppsEnv.name
output processorAppName string = processor.name
output reconcilerJobName string = reconcilerJob.name
output processorIdentityName string = processorIdentity.name
output processorIdentityClientId string = processorIdentity.properties.clientId
output processorIdentityPrincipalId string = processorIdentity.properties.principalId
output reconcilerIdentityName string = reconcilerIdentity.name
output reconcilerIdentityClientId string = reconcilerIdentity.properties.clientId
output reconcilerIdentityPrincipalId string = reconcilerIdentity.properties.principalId
output serviceBusNamespace string = serviceBusAccess.outputs.fullyQualifiedNamespace

@description('Run in the database as an Entra principal, after sql/grants/sqlserver.sql.')
output sqlStatements string = 'CREATE USER [${processorIdentity.name}] FROM EXTERNAL PROVIDER WITH OBJECT_ID = \'${processorIdentity.properties.principalId}\'; ALTER ROLE sbclaim_processor ADD MEMBER [${processorIdentity.name}]; CREATE USER [${reconcilerIdentity.name}] FROM EXTERNAL PROVIDER WITH OBJECT_ID = \'${reconcilerIdentity.properties.principalId}\'; ALTER ROLE sbclaim_reconciler ADD MEMBER [${reconcilerIdentity.name}];'
