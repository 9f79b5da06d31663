// Role assignments on an existing Service Bus namespace, deployed in the
// namespace's resource group (which may differ from the app's).
//
//   receiver  "Azure Service Bus Data Receiver" on the one queue, or the
//             one topic subscription, the processor receives from (not the
//             namespace), for the processor's identity: receive, complete,
//             abandon, dead-letter, renew locks. (The reconciler's redrive
//             calls the downstream API again; it does not re-send to
//             Service Bus.)
//   sender    "Azure Service Bus Data Sender" on each queue and topic the
//             processor publishes follow-up messages to (the outbox:
//             senderQueueNames, senderTopicNames), never on the namespace,
//             for the processor's identity. None when it publishes none.
//   scaler    "Azure Service Bus Data Owner" on the one queue or topic the
//             KEDA scale rule watches, for a separate scaler identity. The
//             azure-servicebus scaler reads the entity's message counts
//             through the management data plane, which needs Manage rights
//             (Data Receiver is not enough: the rule would never scale out).
//             Scoped to the entity, not the namespace. The scaler identity is
//             on the processor app with identitySettings lifecycle 'None'
//             (main.bicep), so the processor's code cannot get its tokens.

@description('Name of the existing Service Bus namespace.')
param namespaceName string

@description('Queue the processor receives from; empty when it uses a topic subscription.')
param queueName string = ''

@description('Topic the processor receives from (with a subscription); empty when it uses a queue.')
param topicName string = ''

@description('Subscription of topicName the processor receives from; empty when it uses a queue.')
param subscriptionName string = ''

@description('Principal (object) id of the processor identity.')
param receiverPrincipalId string

@description('Principal (object) id of the scaler identity; empty to skip the scaler role.')
param scalerPrincipalId string = ''

@description('Queues the processor publishes follow-up messages to (the outbox); it gets Data Sender on each.')
param senderQueueNames array = []

@description('Topics the processor publishes follow-up messages to (the outbox); it gets Data Sender on each.')
param senderTopicNames array = []

// Built-in role definition ids (the same in every tenant).
var serviceBusDataReceiver = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
var serviceBusDataSender = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataOwner = '090c5cfd-751d-490a-894a-3ce6f1109419'

var useQueue = !empty(queueName)

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: namespaceName
}

// Never deployed: only used as a scope. The placeholder names keep the
// resource ids well formed when the other kind of entity is in use.
resource queue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {
  parent: serviceBus
  name: useQueue ? queueName : 'unused'
}

resource topic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' existing = {
  parent: serviceBus
  name: useQueue ? 'unused' : topicName
}

resource topicSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' existing = {
  parent: topic
  name: useQueue ? 'unused' : subscriptionName
}

resource receiverOnQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (useQueue) {
  scope: queue
  name: guid(queue.id, receiverPrincipalId, serviceBusDataReceiver)
  properties: {
    principalId: receiverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    description: 'sbclaim processor: receive and settle messages of this queue'
  }
}

resource receiverOnSubscription 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!useQueue) {
  scope: topicSubscription
  name: guid(topicSubscription.id, receiverPrincipalId, serviceBusDataReceiver)
  properties: {
    principalId: receiverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    description: 'sbclaim processor: receive and settle messages of this subscription'
  }
}

// The outbox's targets: scopes only, each an existing entity.
resource senderQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for name in senderQueueNames: {
  parent: serviceBus
  name: name
}]

resource senderTopics 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' existing = [for name in senderTopicNames: {
  parent: serviceBus
  name: name
}]

resource senderOnQueues 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in senderQueueNames: {
  scope: senderQueues[i]
  name: guid(senderQueues[i].id, receiverPrincipalId, serviceBusDataSender)
  properties: {
    principalId: receiverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    description: 'sbclaim processor: send follow-up messages (the outbox) to this queue'
  }
}]

resource senderOnTopics 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in senderTopicNames: {
  scope: senderTopics[i]
  name: guid(senderTopics[i].id, receiverPrincipalId, serviceBusDataSender)
  properties: {
    principalId: receiverPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    description: 'sbclaim processor: send follow-up messages (the outbox) to this topic'
  }
}]

resource scalerOnQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(scalerPrincipalId) && useQueue) {
  scope: queue
  name: guid(queue.id, scalerPrincipalId, serviceBusDataOwner)
  properties: {
    principalId: scalerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataOwner)
    description: 'sbclaim KEDA scale rule: read the queue message count'
  }
}

resource scalerOnTopic 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(scalerPrincipalId) && !useQueue) {
  scope: topic
  name: guid(topic.id, scalerPrincipalId, serviceBusDataOwner)
  properties: {
    principalId: scalerPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataOwner)
    description: 'sbclaim KEDA scale rule: read the subscription message count'
  }
}

// Only the entity in use is read: the ternary does not evaluate the other
// branch (a placeholder name that does not exist).
@description('The MaxDeliveryCount of the queue, or of the subscription, the processor receives from (main.bicep checks entityMaxDeliveryCount against it).')
output maxDeliveryCount int = useQueue ? queue.properties.maxDeliveryCount : topicSubscription.properties.maxDeliveryCount

@description('Fully qualified namespace host name, e.g. contoso.servicebus.windows.net.')
output fullyQualifiedNamespace string = split(replace(serviceBus.properties.serviceBusEndpoint, 'https://', ''), ':')[0]
